"""Curves: smoothed (an exponential moving average), then downsampled to the
plot's width before plotext sees them; the raw curve stays faint behind."""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual_plotext import PlotextPlot

Series = list[tuple[float, float]]
COLORS = ("blue+", "green+", "red+", "cyan+", "magenta+", "yellow", "gray", "blue", "green", "red")
SMOOTHING = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)  # the weights `[` and `]` step through
DEFAULT_SMOOTHING = 0.6  # TensorBoard's default


def ema(points: Series, weight: float) -> Series:
    """TensorBoard's smoothing: an exponential moving average, debiased so the
    curve starts at the first value rather than at zero; weight 0 is the raw curve."""
    if weight <= 0:
        return list(points)
    out, last = [], 0.0
    for n, (x, y) in enumerate(points, 1):
        last = last * weight + (1 - weight) * y
        out.append((x, last / (1 - weight ** n)))
    return out


def step_smoothing(weight: float, by: int) -> float:
    """The next weight up (by=1) or down (by=-1) the SMOOTHING ladder."""
    i = min(range(len(SMOOTHING)), key=lambda k: abs(SMOOTHING[k] - weight))
    return SMOOTHING[max(0, min(len(SMOOTHING) - 1, i + by))]


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
             right: tuple[str, ...] = (), smoothing: float = 0.0,
             plain: tuple[str, ...] = ()) -> None:
        """`right` names series drawn against a second y axis (lr beside samples/s);
        `smoothing` is the EMA weight (0: raw), for every series but those in `plain`."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        width = max(10, self.size.width - 10)
        drawn = False
        for i, (name, points) in enumerate(series.items()):
            raw, color = usable(points, log), COLORS[i % len(COLORS)]
            side = "right" if name in right else "left"
            if not raw:
                continue
            if smoothing > 0 and name not in plain:
                faint = downsample(raw, width)  # the raw curve, dim, under the smoothed one
                plt.plot([p[0] for p in faint], [p[1] for p in faint], marker="braille",
                         color=color, style="dim", yside=side)
                raw = ema(raw, smoothing)
            pts = downsample(raw, width)
            plt.plot([p[0] for p in pts], [p[1] for p in pts], label=name, marker="braille",
                     color=color, yside=side)
            drawn = True
        if log and drawn:
            plt.yscale("log")
            if right:
                plt.yscale("log", yside="right")
        if not drawn:
            plt.title(f"{title}: no points yet")
        elif smoothing > 0:
            plt.title(f"{title}  (smoothing {smoothing:g})")
        self.refresh()
