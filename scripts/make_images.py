"""Write a folder of small seeded PNG images in class folders, for the `images` task.

    python scripts/make_images.py DIR [--n 20000] [--size 64] [--classes 10] [--seed 0]

Image i belongs to class i % classes and is drawn from its own generator,
seeded by (seed, i): a disc, square, triangle, cross or ring, or stripes,
checks, diagonals or dots, in random colours, place and scale, with pixel
noise. The same arguments give the same bytes. DIR/CLASS/NNNNNN.png is the
ImageFolder layout that `gridrun pack` and the `images` task read.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

CLASSES = ("disc", "square", "triangle", "cross", "ring", "hstripes", "vstripes", "checks",
           "diagonal", "dots")


def draw(label: int, size: int, rng: np.random.Generator, noise: float) -> np.ndarray:
    """One HxWx3 uint8 image of class `label`."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    cy, cx = rng.uniform(0.3 * size, 0.7 * size, 2)
    r = rng.uniform(0.15 * size, 0.3 * size)
    dy, dx = yy - cy, xx - cx
    dist2 = dy**2 + dx**2
    period = int(rng.integers(3, 9))
    phase = int(rng.integers(0, period))
    kind = label % len(CLASSES)
    if kind == 0:
        mask = dist2 <= r**2
    elif kind == 1:
        mask = (np.abs(dy) <= r) & (np.abs(dx) <= r)
    elif kind == 2:
        mask = (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) / 2)
    elif kind == 3:
        bar = r / 3
        mask = ((np.abs(dy) <= bar) & (np.abs(dx) <= r)) | ((np.abs(dx) <= bar) & (np.abs(dy) <= r))
    elif kind == 4:
        mask = (dist2 <= r**2) & (dist2 >= (r / 2) ** 2)
    elif kind == 5:
        mask = ((yy.astype(int) + phase) // period) % 2 == 0
    elif kind == 6:
        mask = ((xx.astype(int) + phase) // period) % 2 == 0
    elif kind == 7:
        mask = (((yy.astype(int) + phase) // period + (xx.astype(int) + phase) // period) % 2) == 0
    elif kind == 8:
        mask = (((yy + xx).astype(int) + phase) // period) % 2 == 0
    else:
        (y1, x1), (y2, x2) = rng.uniform(0.2 * size, 0.8 * size, (2, 2))
        rr = (r / 2) ** 2
        mask = ((yy - y1) ** 2 + (xx - x1) ** 2 <= rr) | ((yy - y2) ** 2 + (xx - x2) ** 2 <= rr)
    background = rng.integers(0, 256, 3)
    foreground = (background + 64 + rng.integers(0, 128, 3)) % 256
    image = np.where(mask[..., None], foreground, background).astype(np.float32)
    image += rng.normal(0, noise, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def make(root: str | Path, n: int = 20_000, size: int = 64, classes: int = 10, seed: int = 0,
         noise: float = 8.0) -> list[Path]:
    """Write n images under root/CLASS/; returns their paths."""
    from PIL import Image

    if not 1 <= classes <= len(CLASSES):
        raise ValueError(f"classes must be 1 to {len(CLASSES)}, not {classes}")
    root = Path(root)
    for name in CLASSES[:classes]:
        (root / name).mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        label = i % classes
        rng = np.random.default_rng([seed, i])
        path = root / CLASSES[label] / f"{i:06d}.png"
        Image.fromarray(draw(label, size, rng, noise)).save(path, format="PNG")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=8.0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    paths = make(args.root, args.n, args.size, args.classes, args.seed, args.noise)
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths):,} images ({args.classes} classes, {args.size}x{args.size}) to "
          f"{args.root}: {total / 1e6:.1f} MB in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
