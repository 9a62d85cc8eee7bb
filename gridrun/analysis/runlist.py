"""`gridrun ls`'s lines: one per run, grep-able, its columns as wide as what they
hold (up to a cap), and on a terminal each line cut at the terminal's width (as
`ps` does) rather than wrapped over three.

Columns appear only where a listed run needs them, so a plain queue lists as it
always has: RUNG and EPOCHS for a search's trials, DEV (how many devices a run
trains on, analysis/devices.py) once any run trains on more than one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gridrun.analysis.devices import devices_of, trainer_of

CAPS = {"experiment": 16, "variant": 24, "best": 22}  # longer values are cut
RIGHT = frozenset({"seed", "dev"})  # numbers: right-aligned under their header
# below a list with a search's trials: BEST is not the value compare ranks them by
BEST_IS = ("BEST: each run's best evaluation of its early-stop metric; `gridrun compare "
           "EXPERIMENT` ranks a search's trials by the evaluation at the end of their rung")


def run_lines(runs: Sequence[Any], note_of: Callable[[Any], str],
              width: int | None = None) -> list[str]:
    """The header and a line per run (store Runs), then, with a search's trials, what BEST
    is; `width`: cut each line there with `…`."""
    # a search's trials: the rung each has reached and the epochs it used of its budget
    search = any(r.config.get("trial") is not None and r.config.get("search") for r in runs)
    devices = {r.id: devices_of(trainer_of(r.config)) for r in runs}
    spread = any(n > 1 for n in devices.values())  # a run on several devices: DEV
    columns = ["id", "status", "experiment", "variant", "seed", *(["dev"] if spread else []),
               *(["rung", "epochs"] if search else []), "best", "note"]
    rows = []
    for r in runs:
        rung, _, used = rung_label(r).partition(" e") if search else ("", "", "")
        rows.append({"id": r.id, "status": r.status, "experiment": r.experiment,
                     "variant": r.variant or "-", "seed": str(r.seed), "dev": str(devices[r.id]),
                     "rung": rung or "-", "epochs": used or "-", "best": best_label(r.summary),
                     "note": " · ".join(x for x in (note_of(r), resumed_note(r.summary)) if x)})
    header = {c: c.upper() for c in columns}
    widths = {c: min(CAPS.get(c, 1 << 20), max(len(row[c]) for row in [header, *rows]))
              for c in columns[:-1]}

    def line(row: dict[str, str], numbers: bool = True) -> str:
        cells = [row[c][:widths[c]].rjust(widths[c]) if c in RIGHT and numbers
                 else row[c][:widths[c]].ljust(widths[c]) for c in columns[:-1]]
        return "  ".join([*cells, row["note"]]).rstrip()

    out = [line(header, numbers=False), *map(line, rows), *([BEST_IS] if search else [])]
    if width:
        out = [text if len(text) <= width else text[:width - 1] + "…" for text in out]
    return out


def rung_label(run: Any) -> str:
    """`r1 e3/9` for a search's trial under a scheduler (spec.search.rung_label), else ""."""
    from gridrun.spec.search import rung_label as label

    return label(run.config.get("search"), run.config.get("trial"),
                 (run.summary or {}).get("epoch"))


def best_label(summary: Any) -> str:
    """`perplexity↓ 3.141`: an ended run's best value of its early-stop metric, or ""."""
    from gridrun.runs import records

    s = records.Summary.from_json(summary)
    if s is None or s.best_value is None or not s.early_stop_metric:
        return ""
    arrow = "↓" if records.direction(s.early_stop_metric, s.metrics) == records.LOWER else "↑"
    return f"{s.early_stop_metric}{arrow} {s.best_value:.4g}"


def resumed_note(summary: Any) -> str:
    """`resumed in another environment: threads 2 -> 1 at step 6` for a run whose resume
    could not keep a field deciding its bits (summary.json's environment_changes), else ""."""
    from gridrun.runs import records

    s = records.Summary.from_json(summary)
    if s is None or not s.environment_changes:
        return ""
    return "resumed in another environment: " + ", ".join(
        map(records.change_text, s.environment_changes))
