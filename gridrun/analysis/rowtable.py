"""A table as rows of plain dicts: what the analysis computes on and prints from.

`gridrun compare` and the compare screen never need pandas: importing it (and
NumPy) costs about as much as the whole command otherwise does. A DataFrame is
made on demand (`to_frame`), for files and for callers that want one, and any
DataFrame comes back in (`from_frame`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def spelled(value: Any) -> Any:
    """A cell as every file gridrun writes for other tools spells it (the CSV files, a
    Parquet file's text columns, MLflow's params and tags): an array (a list, or the tuple
    a frame groups it as), a table or a boolean in JSON's spelling (`[0.9, 0.999]`,
    `true`); anything else as it is. One spelling, so that a value read in one of them
    finds the same run in another."""
    if isinstance(value, bool | list | tuple | dict):
        return json.dumps(value, default=str)
    return value


@dataclass
class RowTable:
    """Rows (a run or a cell each) as dicts; a key a row lacks is a missing value.
    `columns` is the order to show them in; `attrs` what the table's maker knew
    (a DataFrame's `attrs`: metrics, directions, keys, notes...)."""

    rows: list[dict[str, Any]]
    columns: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    @property
    def empty(self) -> bool:
        return not self.rows

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self.rows]

    def where(self, name: str, value: Any) -> RowTable:
        """The rows whose `name` is `value`, with the same columns and attrs."""
        return RowTable([r for r in self.rows if r.get(name) == value], self.columns, dict(self.attrs))

    def to_csv(self) -> str:
        """The rows as CSV in column order; a missing value is an empty field."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows([["" if missing(v := r.get(c)) else spelled(v) for c in self.columns]
                          for r in self.rows])
        return out.getvalue()

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        frame = pd.DataFrame(self.rows, columns=self.columns)
        for name in self.attrs.get("keys", ()):  # 32 stays 32 where a row lacks the key
            if name in frame:
                frame[name] = pd.Series(self.column(name), dtype=object, index=frame.index)
        frame.attrs.update(self.attrs)
        return frame

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> RowTable:
        """A DataFrame's rows (its NaN stay: `missing` knows them)."""
        return cls(frame.to_dict("records"), [str(c) for c in frame.columns], dict(frame.attrs))
