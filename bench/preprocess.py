"""Preprocessing speed: the seeds' scale_image against ours, on the same real JPEGs of mixed sizes.

Prints images/s for both (one process), ours with one process per core, the ratios, and the PSNR of
our output against the seeds'. The one-process rates count CPU time (process_time), in rounds that
alternate the two functions, and report medians: on a shared machine wall time measures the neighbours.
The ratio is printed for all the inputs and for the RGB JPEGs alone (an ImageNet-like tree is nearly all
RGB, and greyscale images gain more). Run: .venv/bin/python bench/preprocess.py [--repeat 5]
`--scale [--images N]`: the whole preprocessing over a synthetic tree in SeaweedFS instead (preprocess_scale.py).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

from scalingrun_trainer.preprocess.images import scale_image
from scalingrun_operator.local.sample_data import fashion_mnist_jpegs, photos

SIDE = 299
LONG_SIDES = [320, 640, 1024, 1600, 2000]


def seed_scale_image(data: bytes, side: int = SIDE) -> bytes:
    """The seeds' code (ANTIALIAS, removed in Pillow 10, was an alias of LANCZOS)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    image.thumbnail((side, side), Image.LANCZOS)
    canvas = Image.new("RGB", (side, side), (255, 255, 255))
    canvas.paste(image, ((side - image.size[0]) // 2, (side - image.size[1]) // 2))
    return canvas.tobytes()


def make_inputs() -> list[bytes]:
    """Photos at 5 sizes (RGB, greyscale and CMYK JPEGs) and upscaled Fashion-MNIST, 300-2000 px."""
    inputs = []
    for index, (_, photo) in enumerate(photos()):
        for long_side in LONG_SIDES:
            scale = long_side / max(photo.size)
            image = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.BICUBIC)
            if index % 5 == 4 and image.mode == "RGB":
                image = image.convert("CMYK")
            buffer = io.BytesIO()
            image.save(buffer, "JPEG", quality=90)
            inputs.append(buffer.getvalue())
    for i, (_, data) in enumerate(fashion_mnist_jpegs(3, size=None)):
        size = 300 + (170 * i) % 1700
        image = Image.open(io.BytesIO(data)).resize((size, size), Image.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90)
        inputs.append(buffer.getvalue())
    return inputs


def psnr(a: bytes, b: bytes) -> float:
    x = np.frombuffer(a, np.uint8).astype(np.float64)
    y = np.frombuffer(b, np.uint8).astype(np.float64)
    mse = np.mean((x - y) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def cpu_rates(functions: dict, inputs, repeat: int) -> dict[str, float]:
    """Median images per CPU-second of each function, over rounds that run them one after another."""
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeat):
        for name, fn in functions.items():
            start = time.process_time()
            for data in inputs:
                fn(data, SIDE)
            seconds[name].append(time.process_time() - start)
    return {name: len(inputs) / float(np.median(taken)) for name, taken in seconds.items()}


def rate_parallel(inputs, repeat: int, workers: int) -> float:
    best = math.inf
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(scale_image, inputs[:workers], [SIDE] * workers))  # warm the workers
        for _ in range(repeat):
            start = time.perf_counter()
            list(pool.map(scale_image, inputs, [SIDE] * len(inputs), chunksize=4))
            best = min(best, time.perf_counter() - start)
    return len(inputs) / best


def main() -> None:
    if "--scale" in sys.argv[1:]:
        from bench.preprocess_scale import main as scale

        return scale([a for a in sys.argv[1:] if a != "--scale"])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    inputs = make_inputs()
    sizes = [Image.open(io.BytesIO(d)).size for d in inputs]
    print(f"{len(inputs)} JPEGs, {min(max(s) for s in sizes)}-{max(max(s) for s in sizes)} px, target {SIDE}x{SIDE}")
    both = {"seed": seed_scale_image, "ours": scale_image}
    rates = cpu_rates(both, inputs, args.repeat)
    seed, ours = rates["seed"], rates["ours"]
    rgb = [d for d in inputs if Image.open(io.BytesIO(d)).mode == "RGB"]
    rgb_rates = cpu_rates(both, rgb, args.repeat)
    cores = os.cpu_count() or 1
    ours_parallel = rate_parallel(inputs, args.repeat, cores)
    quality = [psnr(scale_image(d, SIDE), seed_scale_image(d, SIDE)) for d in inputs]
    modes = {}
    for data in inputs:
        mode = Image.open(io.BytesIO(data)).mode
        modes[mode] = modes.get(mode, 0) + 1
    print("modes: " + ", ".join(f"{mode} {count}" for mode, count in sorted(modes.items())))
    print(f"seed scale_image, 1 process : {seed:7.1f} img/s (CPU time)")
    print(f"ours, 1 process             : {ours:7.1f} img/s (CPU time)   ratio {ours / seed:.2f}x")
    print(f"RGB JPEGs only ({len(rgb):3d})       : seed {rgb_rates['seed']:6.1f}, ours {rgb_rates['ours']:6.1f} img/s"
          f"   ratio {rgb_rates['ours'] / rgb_rates['seed']:.2f}x")
    print(f"ours, {cores} processes           : {ours_parallel:7.1f} img/s (wall)   ratio {ours_parallel / seed:.2f}x")
    print(f"PSNR ours vs seed           : min {min(quality):.1f} dB, median {float(np.median(quality)):.1f} dB")


if __name__ == "__main__":
    main()
