"""One experiment's rows kept between refreshes (the interface's compare screen):
a run is read again only when its store row or, while it runs, its metrics log
changed. The rows themselves are frames.py's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gridrun.analysis.frames import RowTable, _Entry, _stamp, run_rows
from gridrun.runs import layout, states

if TYPE_CHECKING:
    from gridrun.runs.store import Run, Store


class ExperimentFrame:
    """One experiment's rows kept between refreshes: a run is read again only when
    its store row changed (the store's seq) or, while it runs, its metrics log
    grew; with nothing changed, a refresh is one indexed query and a stat of the
    experiment's folder and of each running run's log."""

    def __init__(self, root: str | os.PathLike, experiment: str) -> None:
        self.root, self.experiment = Path(root), experiment
        self.rows: RowTable | None = None
        self.table: Any = None  # a caller's table of `rows`, kept with them
        self._seq = 0
        self._runs: list[Run] = []
        self._cache: dict[str, tuple[Any, _Entry]] = {}
        self._orders: dict[str, dict[str, list[str]]] = {}
        self._folder: tuple[int, int] | None = None
        self._live: dict[str, tuple[int, int] | None] = {}

    def refresh(self, store: Store) -> bool:
        """Bring `rows` up to date with the store and the folders; True when they changed."""
        folder = _stamp(self.root / self.experiment)
        if self.rows is None:
            self._runs = store.list_runs(experiment=self.experiment)
            self._seq = max((r.seq for r in self._runs), default=0)
        else:
            changed, self._seq = store.changes_since(self._seq, experiment=self.experiment)
            live = {i: _stamp(self._log(i)) for i in self._live}
            if not changed and folder == self._folder and live == self._live:
                return False
            if changed:
                self._runs = store.list_runs(experiment=self.experiment)
                self._seq = max([self._seq, *(r.seq for r in self._runs)])
        self._folder, self.table = folder, None
        self.rows = run_rows(self.root, runs=self._runs, experiment=self.experiment,
                             cache=self._cache, orders=self._orders)
        self._live = {i: key[2] for i, (key, _) in self._cache.items() if key[1] == states.RUNNING}
        return True

    def _log(self, run_id: str) -> Path:
        return layout.run_dir(self.root, self.experiment, run_id) / layout.METRICS


