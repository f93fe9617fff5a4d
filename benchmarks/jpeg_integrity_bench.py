"""What the JPEG checks of issue 47 cost per image: the libjpeg-turbo check of a JPEG that Pillow decoded
(`fast.jpeg_warning`) and the image data of a JPEG stored as it is (`encode.image_data_only`).

    python -m benchmarks.jpeg_integrity_bench ../shared/data/ants-bees     # any folder of JPEGs
    python -m benchmarks.jpeg_integrity_bench FOLDER --json out.json

One process, one thread. Every JPEG is converted four times in turn, off, on, on, off (the two steps switched
off: no check, the source's bytes stored as they are, which is what the code did before), so load on a shared
machine falls on both alike; the figure is CPU ms per image (`time.process_time`), in four settings: shrunk to
224 x 224 and stored as it is (`--resize_mode=none`), on each backend.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from transforms.images import encode
from transforms.images import fast as fast_imaging
from transforms.images.diagnosis import ImageRejected
from transforms.images.imaging import convert_image
from transforms.images.settings import ImageSettings

SETTINGS = {
    "auto, to 224 x 224": ImageSettings(width=224, height=224),
    "pillow, to 224 x 224": ImageSettings(width=224, height=224, image_backend="pillow"),
    "auto, stored as it is": ImageSettings(resize_mode="none"),
    "pillow, stored as it is": ImageSettings(resize_mode="none", image_backend="pillow"),
}


def _switch(on: bool, real=(fast_imaging.jpeg_warning, encode.image_data_only)) -> None:
    fast_imaging.jpeg_warning, encode.image_data_only = real if on else (lambda data: None, lambda data: data)


def measure(datas: list[bytes]) -> dict:
    results = {}
    for name, settings in SETTINGS.items():
        times = {False: [], True: []}
        for data in datas:
            try:
                convert_image(data, settings)
            except ImageRejected:
                continue
            for on in (False, True, True, False):
                _switch(on)
                start = time.process_time()
                convert_image(data, settings)
                times[on].append(time.process_time() - start)
        _switch(True)
        before, after = (sum(times[on]) / len(times[on]) * 1e3 for on in (False, True))
        results[name] = {"images": len(times[True]) // 2, "before_ms": round(before, 3), "after_ms": round(after, 3),
                         "extra_ms": round(after - before, 3)}
        print(f"{name:26s} before {before:.3f} ms  after {after:.3f} ms  extra {after - before:+.3f} ms "
              f"({(after / before - 1) * 100:+.0f} %)")
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    paths = sorted(os.path.join(root, name) for root, _, names in os.walk(args.folder) for name in names
                   if name.lower().endswith((".jpg", ".jpeg")))
    datas = [open(path, "rb").read() for path in paths]
    results = measure(datas)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
