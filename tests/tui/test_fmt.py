"""Cells that must fit their fixed-width columns."""

import pytest

from gridrun.tui.source import RunRow
from gridrun.tui.widgets import fmt


@pytest.mark.parametrize(("n", "text"), [(0, "0"), (9999, "9999"), (37_500, "37.5k"),
                                         (999_999, "1M"), (1_234_567, "1.23M"),
                                         (999_999_999, "1G")])
def test_step_counts_stay_short(n, text):
    assert fmt.count(n) == text


@pytest.mark.parametrize(("step", "total"), [(12, 186), (3560, 37_500), (5, 1_234_567),
                                             (999_999, 1_000_000)])
def test_progress_fits_its_column_and_keeps_the_total(step, total):
    row = RunRow(id="a", experiment="e", variant="", seed=0, status="running", step=step,
                 total_steps=total)
    text = fmt.progress(row)
    assert len(text) <= fmt.PROGRESS_WIDTH
    assert text.endswith(f"/{fmt.count(total)}")
