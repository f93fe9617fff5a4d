"""Per-core conversion speed on the same files: the fast core, today's Pillow path, img2dataset's Resizer.

    python -m benchmarks.per_core                              # 200 generated photos, crop to 512, q95
    python -m benchmarks.per_core --input_dir=my_photos/ --rounds 5 --resample=bilinear
    python -m benchmarks.per_core --large                      # generated photos of 1800-3000 px
    python -m benchmarks.per_core --photo_size 640x480 --resize_mode stretch   # all 640x480

Each contender runs in its own process, one thread, in alternating rounds (fast,
pillow, img2dataset, fast, ...), and converts every file from memory; the figure is
images per CPU-second of that process (`time.process_time`), so other load on a
shared machine moves it little, and the ratios are taken round by round.
  * fast: `convert_image` as the pipeline calls it (the fast core for JPEG and PNG);
  * pillow: the same with `image_backend="pillow"` (the converter before the fast core);
  * floor: the bare libraries' work, none of this project's code: libjpeg-turbo decode (simplejpeg,
    DCT-scaled when it shrinks), a whole-pixel centre crop (crop mode), one cv2.resize (INTER_AREA shrinking,
    INTER_LINEAR enlarging), libjpeg-turbo encode; no checks, no statistics, no exact box. What any
    converter on these libraries can reach per core: the ceiling of "fast / pillow";
  * img2dataset: its `Resizer` (OpenCV decode, resize and encode), center_crop to the same
    size, the same JPEG quality, `--resample` for enlarging and INTER_AREA for shrinking.
    It is loaded from its installed module file alone (`pip install --no-deps img2dataset`):
    its package imports its downloader and more, and `albumentations` (scipy, pydantic and a
    second OpenCV) is replaced by the two calls center_crop makes of it, a cv2.resize and a
    slice (`_albumentations_stand_in`). Skipped when img2dataset is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

CONTENDERS = ("fast", "pillow", "floor", "img2dataset")


def generate(root: str, count: int, large: bool, photo_size: tuple[int, int] | None = None) -> None:
    """Photo-like JPEGs: about 450x375 (the median of real photo folders), 1800-3000 px with --large, or all of
    one size with --photo_size."""
    from pipeline.sample_data import photo_like

    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    for i in range(count):
        width = int(rng.uniform(1800, 3000)) if large else int(np.clip(rng.normal(450, 90), 200, 1200))
        height = int(width * rng.uniform(0.65, 1.0))
        if photo_size:
            width, height = photo_size
        photo_like(width, height, rng).save(os.path.join(root, f"{i:05d}.jpg"), quality=90)


def image_files(root: str) -> list[str]:
    return sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names
                  if n.lower().endswith((".jpg", ".jpeg", ".png")))


def _albumentations_stand_in() -> types.ModuleType:
    """The two albumentations transforms the Resizer's center_crop calls, as albumentations does them: one
    cv2.resize of the smallest side to `max_size` (the other side rounded), and a centred slice."""
    import cv2

    class SmallestMaxSize:
        def __init__(self, max_size, interpolation, p=1.0):
            self.max_size, self.interpolation = max_size, interpolation

        def __call__(self, image):
            height, width = image.shape[:2]
            scale = self.max_size / min(height, width)
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            return {"image": cv2.resize(image, size, interpolation=self.interpolation)}

    class CenterCrop:
        def __init__(self, height, width):
            self.height, self.width = height, width

        def __call__(self, image):
            top, left = (image.shape[0] - self.height) // 2, (image.shape[1] - self.width) // 2
            return {"image": image[top:top + self.height, left:left + self.width]}

    module = types.ModuleType("albumentations")
    module.SmallestMaxSize, module.CenterCrop = SmallestMaxSize, CenterCrop
    return module


def _img2dataset_resizer(size: int, resample: str, quality: int):
    spec = importlib.util.find_spec("img2dataset")
    if spec is None or not spec.submodule_search_locations:
        return None
    sys.modules.setdefault("albumentations", _albumentations_stand_in())
    path = os.path.join(list(spec.submodule_search_locations)[0], "resizer.py")
    module_spec = importlib.util.spec_from_file_location("img2dataset_resizer", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    import cv2

    cv2.setNumThreads(1)
    resizer = module.Resizer(image_size=size, resize_mode="center_crop", resize_only_if_bigger=False,
                             upscale_interpolation=resample, downscale_interpolation="area",
                             encode_quality=quality, encode_format="jpg")
    import io

    def convert(data: bytes) -> bytes:
        out, *_, error = resizer(io.BytesIO(data))
        if error:
            raise RuntimeError(error)
        return out

    return convert


def _floor(size: int, quality: int, crop: bool):
    """The bare libraries' resize (after a whole-pixel centre crop with `crop`), as the module docstring says."""
    import cv2
    import simplejpeg

    cv2.setNumThreads(1)

    def convert(data: bytes) -> bytes:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=size, min_height=size)
        height, width = pixels.shape[:2]
        if crop:
            side = min(width, height)
            top, left = (height - side) // 2, (width - side) // 2
            pixels = pixels[top:top + side, left:left + side]
        shrinks = pixels.shape[0] > size and pixels.shape[1] > size
        interpolation = cv2.INTER_AREA if shrinks else cv2.INTER_LINEAR
        resized = cv2.resize(pixels, (size, size), interpolation=interpolation)
        return simplejpeg.encode_jpeg(resized, quality=quality, colorspace="RGB", colorsubsampling="420")

    return convert


def _converter(contender: str, size: int, resample: str, quality: int, resize_mode: str):
    if contender == "floor":
        return _floor(size, quality, resize_mode == "crop") if resize_mode in ("crop", "stretch") and \
            resample == "bilinear" else None
    if contender == "img2dataset":
        return _img2dataset_resizer(size, resample, quality) if resize_mode == "crop" else None
    from transforms.images.imaging import convert_image
    from transforms.images.settings import ImageSettings

    settings = ImageSettings(width=size, height=size, resize_mode=resize_mode, resample=resample, jpeg_quality=quality,
                             image_backend="auto" if contender == "fast" else "pillow")
    return lambda data: convert_image(data, settings).data


def run_one(contender: str, files: list[str], size: int, resample: str, quality: int, resize_mode: str) -> dict:
    """One round of one contender in this process: images per CPU-second and per wall second."""
    convert = _converter(contender, size, resample, quality, resize_mode)
    if convert is None:
        why = ("only for --resize_mode=crop or stretch, --resample=bilinear" if contender == "floor"
               else "img2dataset is not installed (make bench installs it), or no such resize mode")
        return {"contender": contender, "skipped": why}
    datas = [open(path, "rb").read() for path in files]
    convert(datas[0])  # warm-up: lazy imports and tables
    cpu, wall = time.process_time(), time.perf_counter()
    for data in datas:
        convert(data)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"contender": contender, "images": len(datas), "per_cpu_s": len(datas) / cpu,
            "per_wall_s": len(datas) / wall}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input_dir", help="photos to convert (default: generated photo-like JPEGs)")
    parser.add_argument("--images", type=int, default=200, help="generated photos (default 200)")
    parser.add_argument("--large", action="store_true", help="generate 1800-3000 px photos")
    parser.add_argument("--photo_size", help="generate photos of this one size, WxH (e.g. 640x480)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of every contender (default 3)")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--resample", default="bilinear", choices=("bilinear", "bicubic", "lanczos", "area"))
    parser.add_argument("--quality", type=int, default=95)
    parser.add_argument("--resize_mode", default="crop", choices=("crop", "stretch", "pad", "fit"),
                        help="crop (default: img2dataset's center_crop is the same), or another mode without it")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # one round, in a child
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.contender:
        files = [line for line in open(args.files).read().split("\n") if line]
        print(json.dumps(run_one(args.contender, files, args.size, args.resample, args.quality, args.resize_mode)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = args.input_dir or os.path.join(tmp, "photos")
        if not args.input_dir:
            size = tuple(int(side) for side in args.photo_size.lower().split("x")) if args.photo_size else None
            generate(root, args.images, args.large, size)
        listing = os.path.join(tmp, "files.txt")
        with open(listing, "w") as f:
            f.write("\n".join(image_files(root)))
        rounds = []
        for _ in range(args.rounds):
            row = {}
            for contender in CONTENDERS:
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks.per_core", "--contender", contender, "--files", listing,
                     "--size", str(args.size), "--resample", args.resample, "--quality", str(args.quality),
                     "--resize_mode", args.resize_mode],
                    check=True, capture_output=True, text=True).stdout
                row[contender] = json.loads(out.strip().splitlines()[-1])
            rounds.append(row)
    report = {"rounds": rounds, "size": args.size, "resample": args.resample, "quality": args.quality,
              "resize_mode": args.resize_mode,
              "input": args.input_dir or (f"generated {args.photo_size}" if args.photo_size
                                          else "generated large" if args.large else "generated")}
    print(f"images per CPU-second, one thread, {args.rounds} alternating rounds ({report['input']}, "
          f"{args.resize_mode} to "
          f"{args.size}, {args.resample}, q{args.quality}):")
    for contender in CONTENDERS:
        figures = [r[contender]["per_cpu_s"] for r in rounds if "per_cpu_s" in r[contender]]
        if figures:
            median = statistics.median(figures)
            print(f"  {contender:12s} {min(figures):7.1f} - {max(figures):7.1f} (median {median:.1f})")
        else:
            print(f"  {contender:12s} skipped: {rounds[0][contender].get('skipped')}")
    for other in ("pillow", "floor", "img2dataset"):
        ratios = [r["fast"]["per_cpu_s"] / r[other]["per_cpu_s"] for r in rounds if "per_cpu_s" in r[other]]
        if ratios:
            print(f"  fast / {other}: {min(ratios):.2f} - {max(ratios):.2f}x, round by round")
    ceiling = [r["floor"]["per_cpu_s"] / r["pillow"]["per_cpu_s"] for r in rounds if "per_cpu_s" in r["floor"]]
    if ceiling:
        print(f"  floor / pillow: {min(ceiling):.2f} - {max(ceiling):.2f}x (the most any converter on these "
              "libraries can gain over the Pillow path per core)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
