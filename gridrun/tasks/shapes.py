"""`shapes`: a small CNN with BatchNorm classifying procedurally drawn shapes.

Images are drawn once from (data_seed, index): no files, no downloads, and
kept as a camera would give them, 8-bit grayscale `uint8` [H, W, 1] (the raw
sample). `ToModelInput`, the task's `preprocess`, turns raw images into the
CNN's input, (raw - 64) / 128 as float32 [N, 1, H, W]; the dataset calls it on
every sample, and `export-model` ships it with the weights.

Light augmentation (a random shift and flip of the raw image; off with the
task key `augment = false`, or a run's `augmentation = false`, which the data
asks `gridrun.randomness.enabled("augment")` about) draws from torch's global
RNG, the way augmentation code is usually written: gridrun
fetches every batch under its own random stream, so each (seed, epoch, sample)
gets its own view, the same whatever `num_workers` is and wherever a run
resumed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from gridrun import randomness
from gridrun.tasks import InputInfo, Task

CLASSES = ("square", "disc", "cross", "triangle")
# The raw image: background BACKGROUND, the shape BACKGROUND + SCALE, noise around
# both; ToModelInput maps them back to 0.0 and 1.0 exactly (SCALE is a power of 2).
BACKGROUND, SCALE = 64.0, 128.0


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


class ToModelInput(nn.Module):
    """Raw 8-bit images [N, H, W, C] (uint8, 0..255) -> the model's input [N, C, H, W]
    (float32, (raw - 64) / 128: the background 0, the shape 1)."""

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        return ((raw.float() - BACKGROUND) / SCALE).permute(0, 3, 1, 2)


def to_raw(image: torch.Tensor) -> torch.Tensor:
    """A drawn image (float, the background 0, the shape 1) as 8-bit grayscale [H, W, 1]."""
    return (image * SCALE + BACKGROUND).round().clamp(0, 255).to(torch.uint8).unsqueeze(-1)


class Shapes(Dataset):
    """(model input [1, H, W], label): `preprocess` of the raw image, augmented or not.
    The raw images go through `preprocess` once, as one batch; augmentation (a shift
    and a flip, which commute with a per-pixel preprocess) then works on the result."""

    def __init__(self, n: int, size: int, noise: float, seed: int, augment: bool,
                 preprocess: nn.Module):
        self.n, self.size, self.noise, self.seed, self.augment = n, size, noise, seed, augment
        self.raw = torch.stack([self._draw(i) for i in range(n)])  # uint8 [n, H, W, 1]
        self.images = preprocess(self.raw).contiguous()             # float32 [n, 1, H, W]

    def _draw(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        image = draw(i % len(CLASSES), self.size, g)
        return to_raw(image + self.noise * torch.randn(image.shape, generator=g))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = i % len(CLASSES)
        image = self.images[i]
        if self.augment and randomness.enabled("augment"):  # `augmentation = false` says no
            shift = torch.randint(-2, 3, (2,)).tolist()
            image = torch.roll(image, shifts=shift, dims=(1, 2))
            if torch.rand(()) < 0.5:
                image = image.flip(2)
        return image, torch.tensor(label)

    def raw_view(self) -> RawShapes:
        return RawShapes(self)


class RawShapes(Dataset):
    """(raw uint8 image [H, W, 1], label): the samples of a `Shapes` before preprocess
    (and before augmentation)."""

    def __init__(self, shapes: Shapes):
        self.shapes = shapes

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.shapes.raw[i], torch.tensor(i % len(CLASSES))


def cnn(channels: int, classes: int) -> nn.Sequential:
    c = channels
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, classes),
    )


def shapes(channels: int = 8, size: int = 16, noise: float = 0.2, train_size: int = 512,
           val_size: int = 256, augment: bool = True, data_seed: int = 99,
           data_version: int = 2) -> Task:
    """A CNN on drawn squares, discs, crosses and triangles, from 8-bit images.
    Metrics: loss, accuracy.

    `data_version` is in every run id so that runs of different data never
    share one: version 2 (8-bit raw images, the preprocess exported with the
    model) replaced version 1 (float32 images with continuous noise), whose
    numbers this release cannot reproduce."""
    if data_version != 2:
        raise ValueError(f"shapes data_version {data_version} cannot be built by this release: "
                         "only 2 (8-bit images); runs of version 1 keep their records but "
                         "cannot be replayed")

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(model, batch):
        x, y = batch
        logits = model(x)
        return {"loss": (F.cross_entropy(logits, y, reduction="sum"), y.numel()),
                "accuracy": ((logits.argmax(-1) == y).sum(), y.numel())}

    preprocess = ToModelInput()
    val_data = Shapes(val_size, size, noise, data_seed + 1, augment=False, preprocess=preprocess)
    return Task(
        model=cnn(channels, len(CLASSES)),
        train_data=Shapes(train_size, size, noise, data_seed, augment, preprocess),
        val_data=val_data,
        loss=loss, evaluate=evaluate, metrics={"loss": "lower", "accuracy": "higher"},
        preprocess=preprocess, raw_val_data=val_data.raw_view(), class_names=CLASSES,
        input_info={
            "raw": InputInfo("HWC", (0, 255), "8-bit grayscale, one channel: the background "
                             "about 64, the shape about 192"),
            "input": InputInfo("CHW", note="preprocess(raw) = (raw - 64) / 128 as float32"),
        },
    )
