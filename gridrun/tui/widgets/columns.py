"""The runs table's columns: what each shows and sorts by, and which fit a width.

Plain functions over `RunRow`s, no widget: status, experiment, variant, seed,
progress, loss and best stay at 80 columns, the names (experiment, variant)
as whole as the room allows; id, elapsed, eta, samples/s, slot and prio come
back as the terminal widens; scrolled sideways, status and id stay put.
A narrow column's header takes its short name (`loss`, `best↑`), never a
clipped one; the help screen's legend (LEGEND) says what each stands for.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.cells import cell_len, set_cell_size
from rich.style import Style

from gridrun.runs import records as rec
from gridrun.tui.source import RunRow
from gridrun.tui.widgets import fmt

COLUMNS = ("mark", "status", "id", "experiment", "variant", "seed", "progress", "loss", "best",
           "samples/s", "slot", "elapsed", "eta", "prio")
INDEX = {key: i for i, key in enumerate(COLUMNS)}
LABELS = {"mark": " ", "samples/s": "smp/s", "loss": "train loss"}  # best: best_label()
SHORT = {"experiment": "exp", "loss": "loss"}  # a header's name where the long one does not fit
LEGEND = ("[b]columns[/]: exp = experiment; loss (train loss) = the last training loss; "
          "best↑ (best accuracy↑) = the best validation value of the metric the runs stop early "
          "on, ↑ higher or ↓ lower is better; smp/s = samples per second (io: waits for its data, "
          "mem↑: memory grows); prio = queue priority. A variant shows the keys that tell the rows "
          "apart, shortened (hid=32) before any value goes.")
# Least widths; the names grow toward their longest value (up to MAX_WIDTH) when there is room,
# and loss and best toward their long headers.
WIDTHS = {"mark": 1, "status": 11, "id": 10, "experiment": 6, "variant": 8, "seed": 4,
          "progress": fmt.PROGRESS_WIDTH, "loss": 8, "best": 8, "samples/s": 6, "slot": 5,
          "elapsed": 7, "eta": 7, "prio": 4}
# Which columns a narrower terminal keeps: CORE always, then the others in this order.
CORE = ("mark", "status", "experiment", "variant", "seed", "progress", "loss", "best")
PRIORITY = (*CORE, "id", "elapsed", "eta", "samples/s", "slot", "prio")
GROWS = ("experiment", "variant")
WIDENS = frozenset({"slot"})  # as wide as its longest value (`wants`), when it is shown
RIGHT = frozenset({"seed", "loss", "best", "samples/s", "elapsed", "eta", "prio"})
MAX_WIDTH = 32
GAP = 1  # blank cells between two columns
GROUP = "\x00"  # order's entries for group header rows: GROUP + the experiment's name
FROZEN = ("mark", "status", "id")  # stay put when the table scrolls sideways
SCROLLS = tuple(key for key in COLUMNS if key not in FROZEN)
ARROWS = {rec.HIGHER: "↑", rec.LOWER: "↓"}
# What each column sorts by: fmt.rank keys, so a value of the wrong type sorts
# (after the numbers) instead of raising.
R = fmt.rank
SORT_KEYS: dict[str, Callable[[RunRow, float], tuple]] = {
    "status": lambda r, now: (R(r.status),),
    "id": lambda r, now: (R(r.id),),
    "experiment": lambda r, now: (R(r.experiment), R(r.variant), R(r.seed)),
    "variant": lambda r, now: (R(r.variant), R(r.seed)),
    "seed": lambda r, now: (R(r.seed),),
    "progress": lambda r, now: (R(fmt.fraction(r)), R(r.step)),
    "loss": lambda r, now: (R(r.train_loss),),
    "best": lambda r, now: (R(r.best),),
    "samples/s": lambda r, now: (R(-(fmt.finite(r.samples_per_s) or 0.0)),),
    "slot": lambda r, now: (R(r.slot or "~"),),
    "elapsed": lambda r, now: (R(-(fmt.elapsed(r, now) or 0.0)),),
    "eta": lambda r, now: (R(fmt.eta(r, now)),),
    "prio": lambda r, now: (R(-(fmt.finite(r.priority) or 0.0)), R(r.queued_at)),
}
SORTABLE = tuple(SORT_KEYS)
STATUS_STYLES = {s: Style.parse(style) for s, (_, style) in fmt.GLYPHS.items()}
PLAIN = Style()  # never None: line filters (NO_COLOR's monochrome) read every segment's style


def cells(r: RunRow, now: float, marked: bool) -> tuple[str, ...]:
    return ("●" if marked else " ", fmt.status(r.status).plain, fmt.text(r.id),
            fmt.text(r.experiment), fmt.text(r.variant or "-"), fmt.text(r.seed), fmt.progress(r),
            fmt.num(r.train_loss), fmt.num(r.best), fmt.num(r.samples_per_s, 3) + fmt.flags(r.flags),
            fmt.slot(r), fmt.duration(fmt.elapsed(r, now)),
            fmt.duration(fmt.eta(r, now)), fmt.num(r.priority) if r.priority else "")


def wants(r: RunRow, shown: tuple[str, ...]) -> dict[str, int]:
    """The cells a row wants for its values whole: its experiment's name, and a run on
    several devices its slot ("2× gpu0+gpu1"; a plain slot keeps the column's width)."""
    out = {"experiment": cell_len(shown[INDEX["experiment"]])}  # the variant's: Variants.levels
    if (fmt.whole(r.devices) or 1) > 1:
        out["slot"] = cell_len(shown[INDEX["slot"]])
    return out


def least(key: str, want: dict[str, int]) -> int:
    """A column's width where it is not one of the names (GROWS): its least, or for WIDENS
    its longest value's (up to MAX_WIDTH)."""
    return max(WIDTHS[key], min(MAX_WIDTH, want.get(key, 0))) if key in WIDENS else WIDTHS[key]


def status_counts(rows: list[RunRow]) -> list[tuple[str, str, int]]:
    """(status, glyph, how many) of `rows`, in the glyphs' order, unknown states last."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[fmt.text(r.status)] = counts.get(fmt.text(r.status), 0) + 1
    order = (*fmt.GLYPHS, *sorted(set(counts) - set(fmt.GLYPHS)))
    return [(s, fmt.GLYPHS.get(s, ("?", ""))[0], counts[s]) for s in order if counts.get(s)]


def queue_order(r: RunRow, arrival: int) -> tuple:
    """The engine's order: priority, then first queued (then first read)."""
    return (-(fmt.finite(r.priority) or 0.0), fmt.finite(r.queued_at) or 0.0, arrival)


def matches(r: RunRow, needle: str) -> bool:
    if not needle:
        return True
    hay = f"{r.id} {r.experiment} {r.variant} {r.status} seed={r.seed} {r.slot or ''}".lower()
    return all(word in hay for word in needle.lower().split())


def fit(width: int, want: dict[str, int], skip: int = 0) -> dict[str, int]:
    """Column -> width for a line of `width` cells, in display order.

    The core columns always; the names grow toward `want` (their longest value);
    then id and the other columns in priority order while they fit; then loss
    and best toward their long headers; what is left widens the names up to
    MAX_WIDTH. Scrolled sideways (`skip` > 0), the FROZEN columns, then the
    others in display order from the skip-th on."""
    if skip > 0:
        return scrolled(width, want, skip)
    widths = {key: WIDTHS[key] for key in CORE}
    used = sum(widths.values()) + GAP * (len(widths) - 1)

    def add(key: str) -> None:
        nonlocal used
        if used + GAP + least(key, want) <= width:
            widths[key] = least(key, want)
            used += GAP + widths[key]

    def grow(limit: Callable[[str], int]) -> None:
        nonlocal used
        for key in GROWS:
            extra = max(0, min(limit(key) - widths[key], width - used))
            widths[key] += extra
            used += extra

    grow(lambda key: min(MAX_WIDTH, want.get(key, 0)))
    for key in PRIORITY[len(CORE):]:
        add(key)
    # the long headers (`train loss`, `best accuracy↑`) when the room is there
    for key, long in (("loss", cell_len(LABELS["loss"])), ("best", want.get("best", 0)),
                      ("experiment", len("experiment"))):
        more = max(0, min(long - widths[key], width - used))
        widths[key] += more
        used += more
    grow(lambda key: MAX_WIDTH if want.get(key, 0) > widths[key] else 0)
    return {key: widths[key] for key in COLUMNS if key in widths}


def scrolled(width: int, want: dict[str, int], skip: int) -> dict[str, int]:
    widths = {key: WIDTHS[key] for key in FROZEN}
    used = sum(widths.values()) + GAP * (len(widths) - 1)
    for key in SCROLLS[skip:]:
        w = max(WIDTHS[key], min(MAX_WIDTH, want.get(key, 0))) if key in GROWS else least(key, want)
        if used + GAP + w > width:
            w = width - used - GAP if key in GROWS else 0  # a name may shrink to what is left
            if w < WIDTHS[key]:
                break
        widths[key] = w
        used += GAP + w
    return widths


def hidden_right(columns: dict[str, int]) -> bool:
    """Whether columns after the last one shown are off-screen."""
    shown = [k for k in SCROLLS if k in columns]
    return bool(shown) and any(k not in columns for k in SCROLLS[SCROLLS.index(shown[-1]):])


def next_skip(columns: dict[str, int], skip: int, by: int, width: int) -> int:
    """Where scrolling sideways by half a screen goes: right (by=1) from the first
    column shown, or left (-1)."""
    half = max(1, (width - sum(WIDTHS[k] + GAP for k in FROZEN)) // 2)
    moved = 0
    if by > 0:
        skip = SCROLLS.index(next(k for k in columns if k in SCROLLS)) if skip else 0
        while moved < half and skip < len(SCROLLS) - 1:
            moved += WIDTHS[SCROLLS[skip]] + GAP
            skip += 1
    else:
        while moved < half and skip > 0:
            skip -= 1
            moved += WIDTHS[SCROLLS[skip]] + GAP
    return skip


def header(key: str, width: int) -> str:
    """A column's name in `width` cells: its long name, else its short one."""
    label = LABELS.get(key, key)
    return label if cell_len(label) <= width else SHORT.get(key, label)


class Tracked:
    """The early-stop metrics the rows track (how many rows each) and their
    declared directions: what the best column is called."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.directions: dict[str, str] = {}

    def change(self, old: RunRow | None, new: RunRow | None) -> None:
        """A row replaced (`old` None: added; `new` None: removed)."""
        for r, by in ((old, -1), (new, 1)):
            if r is not None and isinstance(r.best_name, str) and r.best_name:
                self.names[r.best_name] = self.names.get(r.best_name, 0) + by
                if by > 0 and r.best_direction in ARROWS:
                    self.directions[r.best_name] = r.best_direction

    def label(self, width: int) -> str:
        """`best accuracy↑`: the metric the rows track, its direction's arrow;
        `best↑` where that does not fit (the legend says which metric);
        `best val` when the rows disagree."""
        tracked = [n for n, count in self.names.items() if count > 0]
        if len(tracked) != 1:
            return "best val"
        arrow = ARROWS.get(rec.direction(tracked[0], self.directions), "")
        whole = f"best {tracked[0]}{arrow}"
        return whole if cell_len(whole) <= width else f"best{arrow}"


def clip(text: str, width: int, right: bool = False) -> str:
    if cell_len(text) > width:
        return set_cell_size(text, width - 1) + "…" if width > 1 else text[:width]
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad
