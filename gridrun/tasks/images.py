"""`images`: a small CNN classifying image files read from disk.

`data` names a folder in the ImageFolder layout (DIR/CLASS/IMAGE; the script
`scripts/make_images.py` writes one) or its packed form, an LMDB or HDF5 file
written by `gridrun pack`. Either way the task reads the same records, the
images' encoded bytes with their class, and decodes each one itself (Pillow),
then augments it (a random shift and flip, drawn from torch's global RNG,
which gridrun seeds per batch): the reader pattern of `gridrun.data`. The
packed bytes are the files' bytes, so training from the folder, from LMDB and
from HDF5 gives bitwise the same metrics and weights.

Every `val_every`-th image is held out for validation. Images of another size
than the first, or that do not decode, end the run naming the file.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from gridrun.data import open_records
from gridrun.tasks import Task


def decode(data: bytes) -> torch.Tensor:
    """Encoded image bytes -> a 3xHxW uint8 tensor."""
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("task images decodes images with Pillow: pip install 'gridrun[data]'") from None
    with Image.open(io.BytesIO(data)) as im:
        rgb = np.array(im.convert("RGB"))
    return torch.from_numpy(rgb).permute(2, 0, 1).contiguous()


class ImageRecords(Dataset):
    """Records `indices` of a folder or a packed file, decoded and (optionally) augmented."""

    def __init__(self, records, indices: np.ndarray, augment: bool, shape: tuple[int, ...]):
        self.records, self.indices, self.augment, self.shape = records, indices, augment, shape
        self.storage = records.storage  # "files" | "lmdb" | "hdf5": what the diagnostics name

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        j = int(self.indices[i])
        data, label = self.records[j]
        try:
            image = decode(data)
        except ImportError:
            raise
        except Exception as e:
            raise ValueError(f"{where(self.records, j)}: not a readable image "
                             f"({type(e).__name__}: {e})") from None
        if tuple(image.shape) != self.shape:
            _, h, w = image.shape
            raise ValueError(f"{where(self.records, j)} is {w}x{h} but the first image is "
                             f"{self.shape[2]}x{self.shape[1]}: images of one size are expected")
        x = image.float().div_(255).sub_(0.5).div_(0.25)
        if self.augment:
            shift = torch.randint(-4, 5, (2,)).tolist()
            x = torch.roll(x, shifts=shift, dims=(1, 2))
            if torch.rand(()) < 0.5:
                x = x.flip(2)
        return x, torch.tensor(label)


def where(records, j: int) -> str:
    """Record j as a person finds it: the file, or the packed file and the file it came from."""
    root = getattr(records, "root", None)
    if root is not None:
        return str(root / records.name(j))
    return f"{records.path} record {j} ({records.name(j)})"


def cnn(channels: int, classes: int) -> nn.Sequential:
    c = channels
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * c, 4 * c, 3, padding=1), nn.BatchNorm2d(4 * c), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * c, classes),
    )


def images(data: str, channels: int = 16, val_every: int = 10, augment: bool = True) -> Task:
    """A CNN on a folder of images or its packed form (`data`). Metrics: loss, accuracy."""
    if val_every < 2:
        raise ValueError(f"val_every must be at least 2, not {val_every}")
    records = open_records(data)
    if len(records.class_names) < 2:
        raise ValueError(f"{data}: {len(records.class_names)} class: at least 2 are needed")
    everything = np.arange(len(records))
    held_out = everything % val_every == 0
    first, _ = records[0]
    try:
        shape = tuple(decode(first).shape)
    except Exception as e:
        raise ValueError(f"{where(records, 0)}: not a readable image ({e})") from None

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": (F.cross_entropy(logits, y, reduction="sum"), y.numel()),
                "accuracy": ((logits.argmax(-1) == y).sum(), y.numel())}

    return Task(
        model=cnn(channels, len(records.class_names)),
        train_data=ImageRecords(records, everything[~held_out], augment, shape),
        val_data=ImageRecords(records, everything[held_out], False, shape),
        loss=loss, evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"},
    )
