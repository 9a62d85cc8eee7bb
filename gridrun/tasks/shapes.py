"""`shapes`: a small CNN with BatchNorm classifying procedurally drawn shapes.

Images are drawn once from (data_seed, index): no files, no downloads. Light
augmentation (a random shift and flip) draws from torch's global RNG, the way
augmentation code is usually written: gridrun fetches every batch under its
own random stream, so each (seed, epoch, sample) gets its own view, the same
whatever `num_workers` is and wherever a run resumed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from gridrun.tasks import Task

CLASSES = ("square", "disc", "cross", "triangle")


def draw(kind: int, size: int, g: torch.Generator) -> torch.Tensor:
    r = int(torch.randint(size // 6, size // 3, (1,), generator=g))
    cy, cx = (int(v) for v in torch.randint(r, size - r, (2,), generator=g))
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    dy, dx = yy - cy, xx - cx
    if kind == 0:
        mask = (dy.abs() <= r) & (dx.abs() <= r)
    elif kind == 1:
        mask = dy**2 + dx**2 <= r**2
    elif kind == 2:
        mask = ((dy.abs() <= r // 3) & (dx.abs() <= r)) | ((dx.abs() <= r // 3) & (dy.abs() <= r))
    else:
        mask = (dy >= -r) & (dy <= r) & (dx.abs() <= (dy + r) / 2)
    return mask.float()


class Shapes(Dataset):
    def __init__(self, n: int, size: int, noise: float, seed: int, augment: bool):
        self.n, self.size, self.noise, self.seed, self.augment = n, size, noise, seed, augment
        self.images = torch.stack([self._draw(i) for i in range(n)])

    def _draw(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        image = draw(i % len(CLASSES), self.size, g)
        return image + self.noise * torch.randn(image.shape, generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = i % len(CLASSES)
        image = self.images[i]
        if self.augment:
            shift = torch.randint(-2, 3, (2,)).tolist()
            image = torch.roll(image, shifts=shift, dims=(0, 1))
            if torch.rand(()) < 0.5:
                image = image.flip(1)
        return image.unsqueeze(0), torch.tensor(label)


def cnn(channels: int, classes: int) -> nn.Sequential:
    c = channels
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, classes),
    )


def shapes(channels: int = 8, size: int = 16, noise: float = 0.2, train_size: int = 512,
           val_size: int = 256, augment: bool = True, data_seed: int = 99) -> Task:
    """A CNN on drawn squares, discs, crosses and triangles. Metrics: loss, accuracy."""

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": (F.cross_entropy(logits, y, reduction="sum"), y.numel()),
                "accuracy": ((logits.argmax(-1) == y).sum(), y.numel())}

    return Task(
        model=cnn(channels, len(CLASSES)),
        train_data=Shapes(train_size, size, noise, data_seed, augment),
        val_data=Shapes(val_size, size, noise, data_seed + 1, augment=False),
        loss=loss, evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"},
    )
