"""Deterministic photo-like sample datasets: the demo's input, the tests' trees and the benchmark's photos.

Each class has its own hue and shape on a textured, noisy background, so a
small model can learn the labels, and sizes and formats vary as in real folders.

    python -m pipeline.sample_data OUT_DIR [--images_per_class N] [--classes a,b,c]
"""

from __future__ import annotations

import argparse
import colorsys
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

DEFAULT_CLASSES = ("circle", "square", "triangle", "stripes")
_SHAPES = ("circle", "square", "triangle", "stripes")


def photo_like(width: int, height: int, rng: np.random.Generator, hue: float | None = None,
               shape: str | None = None) -> Image.Image:
    """An RGB image with a smooth background, texture, noise and one coloured object."""
    hue = rng.random() if hue is None else hue
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.empty((height, width, 3), np.float32)
    for c in range(3):
        fx, fy, phase = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.3)
        base[..., c] = 110 + 60 * np.sin(xx / width * fx * 3.14 + phase) * np.cos(yy / height * fy * 3.14)
    base += rng.normal(0, 9, base.shape)  # sensor noise: keeps JPEG sizes photo-like
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.6))
    draw = ImageDraw.Draw(image)
    r, g, b = (int(255 * v) for v in colorsys.hsv_to_rgb(hue % 1.0, 0.85, 0.95))
    size = int(min(width, height) * rng.uniform(0.35, 0.6))
    cx = int(rng.uniform(0.3, 0.7) * width)
    cy = int(rng.uniform(0.3, 0.7) * height)
    box = (cx - size // 2, cy - size // 2, cx + size // 2, cy + size // 2)
    shape = shape or _SHAPES[int(rng.integers(len(_SHAPES)))]
    if shape == "circle":
        draw.ellipse(box, fill=(r, g, b))
    elif shape == "square":
        draw.rectangle(box, fill=(r, g, b))
    elif shape == "triangle":
        draw.polygon([(box[0], box[3]), (box[2], box[3]), (cx, box[1])], fill=(r, g, b))
    else:
        step = max(4, size // 6)
        for x in range(box[0], box[2], 2 * step):
            draw.rectangle((x, box[1], x + step, box[3]), fill=(r, g, b))
    return image


def generate_dataset(
    root: str,
    images_per_class: int = 50,
    classes: tuple[str, ...] = DEFAULT_CLASSES,
    seed: int = 0,
    min_side: int = 160,
    max_side: int = 720,
    png_share: float = 0.25,
) -> list[str]:
    """Write <root>/<class>/<image> files; returns their relative paths. Same seed, same bytes."""
    rng = np.random.default_rng(seed)
    written = []
    for class_index, class_name in enumerate(classes):
        os.makedirs(os.path.join(root, class_name), exist_ok=True)
        hue = class_index / max(len(classes), 1)
        shape = _SHAPES[class_index % len(_SHAPES)]
        for i in range(images_per_class):
            width = int(rng.integers(min_side, max_side + 1))
            height = int(rng.integers(min_side, max_side + 1))
            image = photo_like(width, height, rng, hue=hue + rng.uniform(-0.03, 0.03), shape=shape)
            if rng.random() < png_share:
                name = f"{class_name}_{i:05d}.png"
                image.save(os.path.join(root, class_name, name), format="PNG", compress_level=1)
            else:
                name = f"{class_name}_{i:05d}.jpg"
                image.save(os.path.join(root, class_name, name), format="JPEG", quality=90)
            written.append(f"{class_name}/{name}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.sample_data", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--images_per_class", type=int, default=50)
    parser.add_argument("--classes", default=",".join(DEFAULT_CLASSES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    paths = generate_dataset(args.out_dir, args.images_per_class, tuple(args.classes.split(",")), args.seed)
    print(f"wrote {len(paths)} images to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
