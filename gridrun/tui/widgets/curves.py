"""Curves: smoothed (an exponential moving average), then downsampled to the
plot's width before plotext sees them; the raw curve stays faint behind."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text
from textual_plotext import PlotextPlot

from gridrun.tui._plotext_hacks import plot_size

Series = list[tuple[float, float]]
COLORS = ("blue+", "green+", "red+", "cyan+", "magenta+", "yellow", "gray", "blue", "green", "red")
# the same colours in Rich's words, for the legend under the plot
RICH = {"blue+": "bright_blue", "green+": "bright_green", "red+": "bright_red", "cyan+": "bright_cyan",
        "magenta+": "bright_magenta", "yellow": "yellow", "gray": "grey50", "blue": "blue",
        "green": "green", "red": "red"}
Y_LABEL_WIDTH = 8  # y tick labels always this wide, so the plot does not move between refreshes
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


def nice_ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """About `n` round values covering lo..hi (1, 2 or 5 times a power of ten); whole
    numbers only with `integer` (steps on an x axis)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, n)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if integer:
        step = max(1, round(step))
    first = math.ceil(lo / step) * step
    ticks, k = [], 0
    while first + k * step <= hi + 1e-9 * step and k < 50:
        ticks.append(first + k * step)
        k += 1
    return ticks


def tick_label(v: float, integer: bool = False) -> str:
    if integer:
        return f"{round(v):d}"
    text = f"{v:.3g}"
    return f"{text:>{Y_LABEL_WIDTH}}"


def usable(points: Series, log: bool) -> Series:
    return [(x, y) for x, y in points
            if y is not None and math.isfinite(y) and (not log or y > 0)]


class Curves(PlotextPlot):
    """A plot of named series, redrawn only when told (`draw`)."""

    legend: Text | None = None  # drawn under the plot, never over the data
    entries: tuple[Text, ...] = ()  # the legend's entries, packed into lines to fit the width

    def draw(self, title: str, series: dict[str, Series], *, log: bool = False,
             right: tuple[str, ...] = (), smoothing: float = 0.0,
             plain: tuple[str, ...] = (), xlabel: str = "step") -> None:
        """`right` names series drawn against a second y axis (lr beside samples/s);
        `smoothing` is the EMA weight (0: raw), for every series but those in `plain`."""
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title)
        width = max(10, self.size.width - 10)
        drawn = False
        legend, entries = Text(), []
        xs: list[float] = []
        ys: dict[str, list[float]] = {"left": [], "right": []}
        for i, (name, points) in enumerate(series.items()):
            raw, color = usable(points, log), COLORS[i % len(COLORS)]
            side = "right" if name in right else "left"
            if not raw:
                continue
            entry = Text("━━ ", style=RICH[color]).append(name)
            legend.append(entry).append("   ")
            entries.append(entry)
            xs += (raw[0][0], raw[-1][0])
            ys[side] += (min(p[1] for p in raw), max(p[1] for p in raw))
            if smoothing > 0 and name not in plain:
                faint = downsample(raw, width)  # the raw curve, dim, under the smoothed one
                plt.plot([p[0] for p in faint], [p[1] for p in faint], marker="braille",
                         color=color, style="dim", yside=side)
                raw = ema(raw, smoothing)
            pts = downsample(raw, width)
            plt.plot([p[0] for p in pts], [p[1] for p in pts], marker="braille",
                     color=color, yside=side)
            drawn = True
        plt.xlabel(xlabel)
        if xs:
            integer = xlabel == "step"
            ticks = nice_ticks(min(xs), max(xs), 5, integer=integer)
            plt.xticks(ticks, [tick_label(t, integer=True) for t in ticks])
        for side, values in ys.items():
            if values and not log:
                ticks = nice_ticks(min(values), max(values), 4)
                plt.yticks(ticks, [tick_label(t) for t in ticks], yside=side)
        self.legend, self.entries = (legend if legend.plain else None), tuple(entries)
        if log and drawn:
            plt.yscale("log")
            if right:
                plt.yscale("log", yside="right")
        if not drawn:
            plt.title(f"{title}: no points yet")
        elif smoothing > 0:
            plt.title(f"{title}  (smoothing {smoothing:g})")
        self.refresh()

    def legend_lines(self, width: int, most: int) -> list[Text]:
        """The entries packed into at most `most` lines of `width`; what does not fit
        ends the last line in an ellipsis."""
        lines: list[Text] = []
        for entry in self.entries:
            if lines and lines[-1].cell_len + 3 + entry.cell_len <= width:
                lines[-1].append("   ").append(entry)
            elif len(lines) < most:
                lines.append(entry.copy())
            else:
                lines[-1].append("   …")
                break
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return lines

    def render(self):
        """The plot, shortened by as many lines as its legend takes (at most a third
        of the height), and the legend under it (outside the data)."""
        height = self.size.height
        if self.legend is None or height < 4:
            return super().render()
        legend = self.legend_lines(self.size.width, max(1, height // 3))
        plot = self.plt
        plot_size(plot, self.size.width, height - len(legend))
        plot.theme(self._get_plotext_theme_name(self.app.theme))
        out = Text.from_ansi(plot.build().rstrip("\n"))
        return Text("\n").join([out, *legend])
