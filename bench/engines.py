"""Keras + MultiWorkerMirroredStrategy against Keras + Horovod: training images/s of the same ScalingRun, run locally
(`scalingrun run --local`'s LocalRun: horovodrun, or mpirun for multi-worker-mirrored) on the same local Parquet,
with the same processes, batch, model and epochs; only spec.training.strategy differs.

EfficientNet-Lite0 frozen with the ImageNet weights, as the quick start trains it, on Fashion-MNIST at --size.
Rounds alternate the order (H M, M H, ...) so that drift of a shared machine falls on both; each run's figure is
the median images/s of its epochs after the first (which includes start-up); the ratio is multi-worker-mirrored's
median over Horovod's, with the per-round ratios beside it.

Run: .venv/bin/python bench/engines.py [--per-class 100] [--size 96] [--batch 64] [--np 2] [--epochs 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Iterator

STRATEGIES = ("horovod", "multi-worker-mirrored")


def write_images(source: Path, per_class: int) -> None:
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    for relative, data in fashion_mnist_jpegs(per_class):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(data)


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's and its children's stdout and stderr into `path` (the trainers' lines, at the fd level)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def train(folder: Path, strategy: str, run_name: str, args) -> list[float]:
    """One local run; the images/s of its epochs."""
    from scalingrun_api.progress import Progress
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.local.runner import LocalRun

    run = parse_scalingrun({
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": run_name},
        "spec": {"dataset": {"source": str(folder / "jpeg"), "output": str(folder / "parquet"), "imageSize": args.size,
                             "preprocessing": {"parallelism": 1}},
                 "model": {"base": "efficientnet_lite0", "weights": "imagenet", "dropout": 0.2},
                 "training": {"strategy": strategy, "batchSizePerWorker": args.batch, "maxEpochs": args.epochs,
                              "featureCache": "off",  # the whole network every epoch, under both engines
                              "earlyStopping": {"enabled": False}, "resume": False},
                 "workers": {"replicas": args.np, "gpusPerWorker": 0}}})
    log = folder / f"{run_name}.log"
    local = LocalRun(run, folder / "local" / run_name)
    with output_to(log):
        code = local.start()
    progress = local.progress or Progress()
    if code or not progress.history:
        raise SystemExit(f"{strategy} run failed:\n{log.read_text()[-3000:]}")
    return [entry.images_per_second for entry in progress.history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {strategy: [] for strategy in STRATEGIES}
    epochs: dict[str, list[list[float]]] = {strategy: [] for strategy in STRATEGIES}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as folder:
        write_images(Path(folder) / "jpeg", args.per_class)
        for round_ in range(args.rounds):
            for strategy in STRATEGIES if round_ % 2 == 0 else reversed(STRATEGIES):
                measured = train(Path(folder), strategy, f"bench-{round_}-{strategy}", args)
                epochs[strategy].append(measured)
                rates[strategy].append(statistics.median(measured[1:] or measured))
                print(f"round {round_ + 1}, {strategy}: {' '.join(f'{r:.0f}' for r in measured)} img/s per epoch",
                      file=sys.stderr, flush=True)
    horovod, mirrored = statistics.median(rates["horovod"]), statistics.median(rates["multi-worker-mirrored"])
    per_round = [m / h for h, m in zip(rates["horovod"], rates["multi-worker-mirrored"])]
    print(f"training, {args.per_class * 10} Fashion-MNIST images at {args.size}x{args.size}, EfficientNet-Lite0 frozen, "
          f"{args.np} processes x batch {args.batch} on CPU, epochs 2..{args.epochs} (median), {args.rounds} rounds")
    print(f"  Keras + Horovod                   : {horovod:8.1f} img/s  "
          f"(per round {' '.join(f'{r:.0f}' for r in rates['horovod'])})")
    print(f"  Keras + MultiWorkerMirrored       : {mirrored:8.1f} img/s  {mirrored / horovod:.2f} x Horovod  "
          f"(per round {' '.join(f'{r:.0f}' for r in rates['multi-worker-mirrored'])}; "
          f"ratios {' '.join(f'{r:.2f}' for r in per_round)})")


if __name__ == "__main__":
    main()
