"""The switches on a run's randomness that the trainer applies itself
(spec/sources.py): dropout modules as the identity. `shuffle = false` is the
data order's (data.BatchKeys); `augmentation = false` is the task's to apply,
told through `gridrun.randomness`."""

from __future__ import annotations

from typing import Any

from torch import nn

# every dropout module of torch.nn (and any subclass of one): each draws a mask in training
DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
            nn.FeatureAlphaDropout)


def _identity(input: Any, *args: Any, **kwargs: Any) -> Any:
    return input


def dropout_off(model: nn.Module) -> int:
    """Make every dropout module of `model` the identity, in training too, and set the
    attention dropout of every `nn.MultiheadAttention` to 0 (the weights and the
    state dict stay as they are). A model's
    own `F.dropout` calls are not modules: the task can ask
    `gridrun.randomness.enabled("dropout")`. Returns how many of them dropped
    anything (p > 0)."""
    changed = dropout_modules(model)
    for module in model.modules():
        if isinstance(module, DROPOUTS):
            module.forward = _identity
        elif isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0
    return changed


def dropout_modules(model: nn.Module) -> int:
    """How many modules of `model` drop anything in training (p > 0)."""
    return sum(bool(m.p) if isinstance(m, DROPOUTS) else
               isinstance(m, nn.MultiheadAttention) and bool(m.dropout) for m in model.modules())
