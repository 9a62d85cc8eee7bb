"""Curves: downsampled to the plot's width before plotext sees them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual_plotext import PlotextPlot

Series = list[tuple[float, float]]


def downsample(points: Sequence[tuple[float, float]], width: int) -> Series:
    """At most ~2*width points, keeping each bucket's min and max so spikes survive."""
    n = len(points)
    if n <= 2 * width or width <= 0:
        return list(points)
    out: Series = []
    step = n / width
    for b in range(width):
        bucket = points[int(b * step):int((b + 1) * step)] or points[-1:]
        lo = min(bucket, key=lambda p: p[1])
        hi = max(bucket, key=lambda p: p[1])
        out.extend(sorted({lo, hi}))
    return out


def usable(points: Series, log: bool) -> Series:
    return [(x, y) for x, y in points
            if y is not None and math.isfinite(y) and (not log or y > 0)]


class Curves(PlotextPlot):
    """A plot of named series, redrawn only when told (`draw`)."""

    def draw(self, title: str, series: dict[str, Series], *, log: bool = False,
             right: tuple[str, ...] = ()) -> None:
        """`right` names series drawn against a second y axis (lr beside samples/s)."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        width = max(10, self.size.width - 10)
        drawn = False
        for name, points in series.items():
            pts = downsample(usable(points, log), width)
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], label=name, marker="braille",
                         yside="right" if name in right else "left")
                drawn = True
        if log and drawn:
            plt.yscale("log")
            if right:
                plt.yscale("log", yside="right")
        if not drawn:
            plt.title(f"{title}: no points yet")
        self.refresh()
