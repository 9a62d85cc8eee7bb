"""`--static`: every input dimension fixed, and how a smaller input is fed to such a model.

The sizes: a dimension declared with a finite `max` (sort's `length`, at most
`max_len`) is fixed at that max, so that every input the dynamic model accepts
still fits; any other (the batch) at the size of the example it was exported with.

Feeding (parity here, `gridrun predict` from model.json alone): an input smaller
than the fixed sizes is padded up to them, along axis 0 (the batch) with copies
of its last sample, along any other axis with zeros (sort: token 0 is padding
and a `False` mask ignores the position), and every output is cut back along the
axes that follow those dimensions. A batch larger than the fixed one is fed in
chunks by `gridrun predict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

PADDING = ("an input smaller than the fixed sizes is padded up to them: along axis 0 (the batch) "
           "with copies of its last sample, along any other named axis with zeros; outputs are "
           "cut back along their named axes")


def fixed_sizes(dims: Mapping[str, Any], example: Mapping[str, int]) -> dict[str, int]:
    """Each dynamic dimension's static size: its declared max when finite, else the example's."""
    sizes = {}
    for name, size in example.items():
        top = getattr(dims.get(name), "max", None)
        sizes[name] = int(top) if isinstance(top, int) and not isinstance(top, bool) else size
    return sizes


def pad(t: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """`t` grown to `size` along `axis`: repeats of the last slice on axis 0, zeros elsewhere."""
    missing = size - t.shape[axis]
    if missing <= 0:
        return t
    if axis == 0:
        fill = t.narrow(0, t.shape[0] - 1, 1).expand(missing, *t.shape[1:])
    else:
        shape = list(t.shape)
        shape[axis] = missing
        fill = t.new_zeros(shape)
    return torch.cat([t, fill], dim=axis)


def pad_inputs(inputs: Mapping[str, torch.Tensor], axes: Mapping[str, Mapping[int, str]],
               sizes: Mapping[str, int]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in inputs.items():
        for axis, dim in axes.get(name, {}).items():
            if t.shape[axis] > sizes[dim]:
                raise ValueError(f"input {name!r} has {t.shape[axis]} along axis {axis} ({dim}); "
                                 f"the static model takes at most {sizes[dim]}")
            t = pad(t, axis, sizes[dim])
        out[name] = t
    return out


def output_axes(run: Callable[[dict[str, torch.Tensor]], list[torch.Tensor]],
                inputs: dict[str, torch.Tensor], axes: Mapping[str, Mapping[int, str]],
                example_outputs: list[torch.Tensor]) -> list[dict[int, str]]:
    """Which axis of each output follows which dynamic dimension: found by running the model
    on the example one shorter along each dimension; where that cannot be done, an output
    axis of a dimension's (unique) example size is taken to be it."""
    sizes = {d: int(inputs[n].shape[a]) for n, ax in axes.items() for a, d in ax.items()}
    found: list[dict[int, str]] = [{} for _ in example_outputs]
    unresolved = []
    for dim, size in sizes.items():
        probe = dict(inputs)
        for n, ax in axes.items():
            for a, d in ax.items():
                if d == dim:
                    probe[n] = probe[n].narrow(a, 0, size - 1)
        try:
            if size < 2:
                raise ValueError("too small to shorten")
            with torch.inference_mode():
                shorter = run(probe)
        except Exception:
            unresolved.append(dim)
            continue
        for i, (a, b) in enumerate(zip(example_outputs, shorter, strict=True)):
            for axis, (x, y) in enumerate(zip(a.shape, b.shape, strict=False)):
                if x != y:
                    found[i][axis] = dim
    for dim in unresolved:
        if sum(s == sizes[dim] for s in sizes.values()) > 1:
            continue  # two dimensions of one size: no way to tell
        for i, t in enumerate(example_outputs):
            for axis, s in enumerate(t.shape):
                if s == sizes[dim] and axis not in found[i]:
                    found[i][axis] = dim
    return found


def cut(flat: list[torch.Tensor], out_axes: list[dict[int, str]],
        sizes: Mapping[str, int]) -> list[torch.Tensor]:
    """Outputs of a padded call cut back to the sizes the caller gave."""
    out = []
    for t, axes in zip(flat, out_axes, strict=True):
        for axis, dim in axes.items():
            if dim in sizes and axis < t.dim():
                t = t.narrow(axis, 0, sizes[dim])
        out.append(t)
    return out


class Padded(torch.nn.Module):
    """A static exported model behind the dynamic calling convention: pads, runs, cuts."""

    def __init__(self, exported: Any, sig: Any):
        super().__init__()
        self.exported, self.sig = exported, sig
        self.fmt = exported.fmt

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        inputs = self.sig.bind(args, kwargs)
        given = self.sig.dim_sizes(inputs)
        padded = pad_inputs(inputs, self.sig.axes, self.sig.static)
        return self.sig.rebuild(cut(self.exported.run(padded), self.sig.out_axes, given))
