"""The one place that reaches into plotext's private API (check it when plotext moves).

plotext's public `plotsize` does not resize a figure that was built before;
textual-plotext's own `PlotextPlot.render` calls the private `_set_size` after it
for the same reason (textual-plotext issue 5). The curves draw their legend on a
line of their own under the plot, so they size the plot one line shorter.
"""

from __future__ import annotations

from typing import Any


def plot_size(plot: Any, width: int, height: int) -> None:
    plot.plotsize(width, height)
    set_size = getattr(plot, "_set_size", None)
    if set_size is not None:
        set_size(width, height)
