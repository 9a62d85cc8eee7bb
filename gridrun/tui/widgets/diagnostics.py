"""A run's diagnostics: the gradient norm (log scale), the share of time spent
waiting for data, memory over time, and what the summary found (parameters
without a gradient, where a divergence started, the environment)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from gridrun.runs import records as rec
from gridrun.tui.widgets.curves import Curves, Series

MIB = 2**20


def _scaled(points: Series, by: float) -> Series:
    return [(x, y / by) for x, y in points]


def findings(summary: Mapping[str, Any] | None) -> Text:
    """The summary's diagnostics in a few lines: what to look at first."""
    s = summary or {}
    text = Text()
    d = s.get("divergence")
    if isinstance(d, dict):
        where = f"{d.get('module')} ({d.get('type')})" if d.get("module") else "outside any module"
        text.append("diverged ", style="bold red").append(
            f"at step {d.get('step')}: first non-finite {d.get('phase') or '?'} value in {where}")
        if d.get("op"):
            text.append(f"; anomaly mode: {d['op']}")
        if d.get("batch_finite") is False:
            text.append("; the input batch held NaN/Inf", style="bold")
        if d.get("note"):
            text.append(f" ({d['note']})")
        text.append("\n")
    unused = s.get("unused_parameters") or []
    if unused:
        text.append("no gradient ", style="bold yellow").append(
            ", ".join(unused[:6]) + (f" (+{len(unused) - 6} more)" if len(unused) > 6 else "") + "\n")
    bound = s.get("input_bound")
    if isinstance(bound, dict) and isinstance(bound.get("text"), str):
        text.append("input-bound ", style="bold yellow").append(
            bound["text"].removeprefix("input-bound: ") + "\n")
    params = s.get("parameters")
    if isinstance(params, dict):
        text.append(f"parameters {params.get('total', 0):,} ({params.get('trainable', 0):,} trainable)"
                    f", {s.get('dtype') or '?'}")
    if isinstance(s.get("data_wait"), int | float):
        text.append(f"  data wait {s['data_wait']:.0%}")
    env = s.get("environment")
    if isinstance(env, dict):
        gpu = f"{env.get('gpu')}" if env.get("gpu") else "cpu"
        text.append(f"\ntorch {env.get('torch')}  CUDA {env.get('cuda') or '-'}  cuDNN "
                    f"{env.get('cudnn') or '-'}  driver {env.get('driver') or '-'}  {gpu}", style="dim")
        loader = env.get("loader")
        if isinstance(loader, dict) and isinstance(loader.get("chosen"), dict):
            rate, workers = loader.get("samples_per_s"), loader["chosen"].get("num_workers")
            text.append(f"\nloader auto: {workers} worker{'' if workers == 1 else 's'}, prefetch "
                        f"{loader['chosen'].get('prefetch_factor')}"
                        + (f", {rate:,.0f} samples/s" if isinstance(rate, int | float) else "")
                        + f" ({len(loader.get('trials') or [])} settings measured)", style="dim")
    return text


class Diagnostics(Vertical):
    """Three plots and the findings line; the detail screen feeds both."""

    DEFAULT_CSS = """
    Diagnostics #diag-findings { height: auto; padding: 0 1; }
    Diagnostics Horizontal { height: 1fr; }
    Diagnostics Curves { height: 1fr; min-height: 8; }
    """

    def compose(self) -> ComposeResult:
        yield Static("", id="diag-findings")
        with Horizontal():
            yield Curves(id="diag-grad")
            yield Curves(id="diag-wait")
        yield Curves(id="diag-memory")

    def show_summary(self, summary: Mapping[str, Any] | None) -> None:
        self.query_one("#diag-findings", Static).update(findings(summary))

    def draw(self, series: Mapping[str, Series], smoothing: float = 0.0) -> None:
        pick = {k: series[k] for k in (rec.GRAD_NORM,) if k in series}
        self.query_one("#diag-grad", Curves).draw(
            "grad norm before clipping (log)", pick, log=True, smoothing=smoothing)
        wait = {"data wait": series.get(rec.DATA_WAIT, [])}
        if rec.CLIPPED in series:
            wait["clipped"] = series[rec.CLIPPED]
        self.query_one("#diag-wait", Curves).draw("share of each interval", wait, plain=tuple(wait))
        memory = {f"{k} MiB": _scaled(series[k], MIB)
                  for k in (rec.MEM_ALLOCATED, rec.MEM_RESERVED, rec.MEM_PEAK, rec.RSS) if k in series}
        self.query_one("#diag-memory", Curves).draw("memory", memory, plain=tuple(memory))
