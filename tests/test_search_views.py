"""A search in the views: compare's leaderboard and rank correlations, the CSV's trial,
rung and epochs_used, ls's RUNG and EPOCHS."""

from __future__ import annotations

import pytest

from gridrun.analysis.rowtable import RowTable
from gridrun.analysis.search import format_leaderboard, leaderboard, ranks, spearman


def test_spearman_and_ranks():
    assert ranks([3, 1, 2, 2]) == [4.0, 1.0, 2.5, 2.5]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def row(trial: int, status: str, epochs: int, acc: float, lr: float, seed: int = 0) -> dict:
    return {"id": f"r{trial}{seed}", "trial": trial, "search": "s", "status": status,
            "epochs": 9, "epochs_used": epochs, "rung": {1: 0, 3: 1, 9: 2}[epochs],
            "search_metric": "accuracy", "final_accuracy": acc, "lr": lr, "seed": seed}


def test_the_leaderboard_ranks_the_furthest_trained_first_then_the_metric():
    rows = [row(0, "stopped", 1, 0.9, 0.1), row(1, "completed", 9, 0.7, 0.01),
            row(2, "stopped", 3, 0.8, 0.001), row(3, "stopped", 3, 0.9, 0.003),
            row(3, "stopped", 3, 0.8, 0.003, seed=1)]
    table = RowTable(rows, list(rows[0]), {"directions": {"accuracy": "higher"}})
    board = leaderboard(table, ["lr"], {0: 0.5, 1: 0.4, 2: 0.3, 3: 0.2})
    assert [t["trial"] for t in board["leaders"]] == [1, 3, 2, 0]
    assert board["leaders"][1]["value"] == pytest.approx(0.85)  # the mean over its seeds
    assert (board["epochs_used"], board["epochs_full"]) == (1 + 9 + 3 + 3 + 3, 5 * 9)
    assert board["spearman"]["lr"] == pytest.approx(0.8)  # on the first rung: lr up, accuracy up
    text = format_leaderboard(board, "tune")
    assert "RANK  TRIAL  STATUS     RUNG  EPOCHS  accuracy↑  lr" in text
    assert "budget used: 19 of 45 epochs (42%)" in text
    assert "Spearman rank correlation with accuracy (on the first rung): lr +0.80" in text
