"""A search in the views: compare's leaderboard and rank correlations, the CSV's trial,
rung and epochs_used, ls's RUNG and EPOCHS."""

from __future__ import annotations

import pytest

from gridrun.analysis.rowtable import RowTable
from gridrun.analysis.search import leaderboard, ranks, spearman
from gridrun.analysis.tables import format_leaderboard


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
    assert "RANK  TRIAL  STATUS     RUNG  EPOCHS  accuracy↑ at rung end  best accuracy↑  lr" in text
    assert "budget used: 19 of 45 epochs (42%)" in text
    assert "Spearman rank correlation with accuracy (on the first rung): lr +0.80" in text


def test_every_compare_format_of_a_leaderboard_is_that_format():
    """`gridrun compare SEARCH --format csv|markdown|latex` (the aligned table came out
    whatever the format): CSV with the values at full precision, markdown and LaTeX tables
    with the winner's metric in bold and the budget line as text or a comment."""
    import csv
    import io

    rows = [row(0, "stopped", 1, 0.912345678, 0.1), row(1, "completed", 9, 0.7, 0.012345678)]
    table = RowTable(rows, list(rows[0]), {"directions": {"accuracy": "higher"}})
    board = leaderboard(table, ["lr"])
    parsed = list(csv.DictReader(io.StringIO(format_leaderboard(board, "tune", "csv"))))
    assert [list(r.values()) for r in parsed] == [["1", "1", "completed", "2", "9", "0.7", "",
                                                   "0.012345678"],
                                                  ["2", "0", "stopped", "0", "1", "0.912345678",
                                                   "", "0.1"]]
    assert list(parsed[0]) == ["rank", "trial", "status", "rung", "epochs", "accuracy",
                               "best_accuracy", "lr"]
    md = format_leaderboard(board, "tune", "markdown").splitlines()
    assert md[0] == ("| RANK | TRIAL | STATUS | RUNG | EPOCHS | accuracy↑ at rung end "
                     "| best accuracy↑ | lr |")
    assert md[1] == "|---|---|---|---|---|---|---|---|"
    assert md[2] == "| 1 | t1 | completed | r2 | 9 | **0.7** | - | 0.01235 |"
    assert md[-4] == "" and md[-3].startswith("accuracy↑ at rung end: ")
    assert md[-2].startswith("budget used: 10 of 18 epochs")
    tex = format_leaderboard(board, "tune", "latex")
    assert (r"RANK & TRIAL & STATUS & RUNG & EPOCHS & accuracy$\uparrow$ at rung end & "
            r"best accuracy$\uparrow$ & lr \\") in tex
    assert r"1 & t1 & completed & r2 & 9 & \textbf{0.7} & - & 0.01235 \\" in tex
    assert "% budget used: 10 of 18 epochs" in tex and tex.rstrip().endswith(r"\end{tabular}")
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        format_leaderboard(board, "tune", "xml")


def test_rank_correlations_on_a_first_rung_some_trials_lack():
    """First-rung results kept for some trials only (a store rebuilt from the folders,
    before the engine ran): the correlation is over the trials that have one, no crash."""
    rows = [row(0, "completed", 9, 0.9, 0.1), row(1, "waiting", 1, 0.7, 0.01),
            row(2, "waiting", 1, 0.8, 0.001), row(3, "waiting", 1, 0.6, 0.003),
            row(4, "waiting", 1, 0.5, 0.0001)]
    table = RowTable(rows, list(rows[0]), {"directions": {"accuracy": "higher"}})
    board = leaderboard(table, ["lr"], {1: 0.7, 2: 0.8, 3: 0.6, 4: 0.5})
    assert board["leaders"][0]["trial"] == 0
    assert board["spearman"]["lr"] == pytest.approx(spearman([0.01, 0.001, 0.003, 0.0001],
                                                             [0.7, 0.8, 0.6, 0.5]))


def test_the_leaderboard_and_ls_say_which_value_each_shows():
    """One trial read 0.587 on the leaderboard and 0.6246 in `ls`, nothing on either
    screen saying why: the leaderboard ranks by the evaluation at the end of the rung a
    trial reached, ls shows its best evaluation. Each now names its value, and the
    leaderboard shows the best beside the value it ranks by (its CSV too, a column added)."""
    import csv
    import io
    import json
    from types import SimpleNamespace

    from gridrun.analysis.search import leaderboard_cells
    from gridrun.commands.follow import run_lines

    rows = [{**row(0, "stopped", 1, 0.587, 0.1), "own_accuracy": 0.6246},
            {**row(1, "completed", 9, 0.7, 0.01), "own_accuracy": 0.71}]
    table = RowTable(rows, list(rows[0]), {"directions": {"accuracy": "higher"}})
    board = leaderboard(table, ["lr"])
    assert [(t["value"], t["best"]) for t in board["leaders"]] == [(0.7, 0.71), (0.587, 0.6246)]
    head, cells = leaderboard_cells(board)  # the CLI's and the interface's
    assert head[5:] == ["accuracy↑ at rung end", "best accuracy↑", "lr"]
    assert cells[1][5:7] == ["0.587", "0.6246"]
    text = format_leaderboard(board, "tune")
    assert "accuracy↑ at rung end  best accuracy↑  lr" in text.splitlines()[1]
    assert ("at rung end: each trial's evaluation at the end of the last rung it reached "
            "(the mean over its seeds), what the search ranks by; best: its best evaluation "
            "(what `gridrun ls` shows as BEST)") in text
    parsed = list(csv.DictReader(io.StringIO(format_leaderboard(board, "tune", "csv"))))
    assert list(parsed[1]) == ["rank", "trial", "status", "rung", "epochs", "accuracy",
                               "best_accuracy", "lr"]
    assert (parsed[1]["accuracy"], parsed[1]["best_accuracy"]) == ("0.587", "0.6246")
    assert json.loads(format_leaderboard(board, "tune", "json"))["leaders"][1]["best"] == 0.6246
    assert "at rung end:" in format_leaderboard(board, "tune", "markdown")

    search = {"id": "s", "scheduler": "asha", "min_epochs": 1, "max_epochs": 9, "eta": 3}
    trial = SimpleNamespace(id="r00", status="stopped", experiment="tune", variant="t0", seed=0,
                            config={"trial": 0, "search": search},
                            summary={"epoch": 1, "early_stop_metric": "accuracy",
                                     "metrics": {"accuracy": "higher"},
                                     "best": {"accuracy": 0.6246}, "final": {"accuracy": 0.587}})
    lines = run_lines([trial], lambda r: "")
    assert "accuracy↑ 0.6246" in lines[1]
    assert lines[-1] == ("BEST: each run's best evaluation of its early-stop metric; "
                         "`gridrun compare EXPERIMENT` ranks a search's trials by the "
                         "evaluation at the end of their rung")
    plain = SimpleNamespace(**{**vars(trial), "config": {}})
    assert len(run_lines([plain], lambda r: "")) == 2  # no search listed: no footer
