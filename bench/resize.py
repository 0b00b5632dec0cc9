"""Issue 42: a run shrunk from 2 processes to 1 after its first epoch and grown back after its second, against the
same run at a fixed 2 processes: the last epoch's val_accuracy of each, per seed, and the differences.

The resized run is three attempts of one run (the same spec: workers.replicas 2, its run location, resume on):
2 processes train epoch 1, 1 process (accumulating 2 micro-batches per update: core/scaling.py) epoch 2, 2
processes epoch 3, each resuming from the epoch-boundary checkpoint the one before wrote. An attempt that reached
its maxEpochs marks the checkpoint finished; the script unmarks it (state.json `finished: false`), which leaves the
checkpoint an attempt stopped by the operator's resize at that epoch boundary leaves.

Each seed preprocesses the data once (its split and row order) and seeds the head and the batch order. Keras runs
under horovodrun (.venv), Keras + MultiWorkerMirroredStrategy under mpirun (.venv), Lightning under mpirun
(.venv-lightning); EfficientNet-Lite0 with the ImageNet weights, frozen (the quick start's model), cached features.

Run: .venv/bin/python bench/resize.py [--per-class 200] [--size 32] [--batch 16] [--seeds 1,2,3]
     [--frameworks keras,keras-mirrored,pytorch-lightning]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.feature_cache import ENGINES, available_frameworks, command  # noqa: E402 - the same launchers
from bench.lightning import preprocess  # noqa: E402 - the same data
from scalingrun_api.progress import PROGRESS_FILE, Progress  # noqa: E402

SPEC_PROCESSES = 2
# (processes, epochs trained by the end of the attempt): shrunk after epoch 1, grown back after epoch 2.
RESIZED = ((2, 1), (1, 2), (2, 3))
EPOCHS = RESIZED[-1][1]


def write_config(folder: Path, output: str, name: str, framework: str, max_epochs: int, args, seed: int) -> Path:
    from scalingrun_operator.builders.config import build_trainer_config
    from scalingrun_operator.schema.validation import parse_scalingrun

    spec = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": f"bench-{name}"},
            "spec": {"dataset": {"source": str(folder / "jpeg"), "output": output, "imageSize": args.size, "seed": seed},
                     "model": {"base": "efficientnet_lite0", "weights": "imagenet", "dropout": 0.2},
                     "training": {"framework": ENGINES[framework][0], "strategy": ENGINES[framework][1],
                                  "batchSizePerWorker": args.batch, "maxEpochs": max_epochs,
                                  "earlyStopping": {"enabled": False},
                                  "checkpoint": {"location": str(folder / "runs" / name)}},
                     "workers": {"replicas": SPEC_PROCESSES, "gpusPerWorker": 0}}}
    path = folder / f"{name}-{max_epochs}.json"
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def attempt(framework: str, processes: int, config: Path) -> str:
    result = subprocess.run(command(framework, processes, config), capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if result.returncode:
        raise SystemExit(f"{framework} on {processes} processes failed:\n{result.stdout[-2000:]}\n"
                         f"{result.stderr[-2000:]}")
    return result.stdout


def unfinish(run: Path) -> None:
    state_at = run / "checkpoints" / "state.json"
    state = json.loads(state_at.read_text())
    state_at.write_text(json.dumps({**state, "finished": False}))


def train(framework: str, folder: Path, output: str, args, seed: int, resized: bool) -> tuple[Progress, str]:
    """The run's progress document when it finished, and its attempts' start lines."""
    name = f"{framework}-{'resized' if resized else 'fixed'}-{seed}"
    plan = RESIZED if resized else ((SPEC_PROCESSES, EPOCHS),)
    headings = []
    for processes, epochs in plan:
        stdout = attempt(framework, processes, write_config(folder, output, name, framework, epochs, args, seed))
        headings += [line for line in stdout.splitlines() if "effective batch" in line]
        if epochs < EPOCHS:
            unfinish(folder / "runs" / name)
    progress = Progress.read(json.loads((folder / "runs" / name / PROGRESS_FILE).read_text()))
    if progress.state != "succeeded" or [entry.epoch for entry in progress.history] != list(range(1, EPOCHS + 1)):
        raise SystemExit(f"{name}: unexpected progress document {progress.document()}")
    return progress, " | ".join(headings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=200)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--frameworks", default="keras,keras-mirrored,pytorch-lightning")
    args = parser.parse_args()
    frameworks = available_frameworks(args.frameworks)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-resize-") as folder:
        data_dir = Path(folder)
        outputs = {seed: preprocess(data_dir, args.per_class, args.size, SPEC_PROCESSES, seed) for seed in seeds}
        print(f"{args.per_class * 10} Fashion-MNIST images at {args.size}x{args.size}, EfficientNet-Lite0 frozen "
              f"(ImageNet), spec {SPEC_PROCESSES} processes x batch {args.batch}, {EPOCHS} epochs; resized: "
              f"{' -> '.join(str(p) for p, _ in RESIZED)} processes at epoch boundaries; seeds {seeds}", flush=True)
        for framework in frameworks:
            differences = []
            for seed in seeds:
                fixed, _ = train(framework, data_dir, outputs[seed], args, seed, resized=False)
                resized, headings = train(framework, data_dir, outputs[seed], args, seed, resized=True)
                accuracy = fixed.metrics["val_accuracy"], resized.metrics["val_accuracy"]
                differences.append(accuracy[1] - accuracy[0])
                print(f"  {framework} seed {seed}: val_accuracy fixed {accuracy[0]:.3f}, resized {accuracy[1]:.3f} "
                      f"({differences[-1]:+.3f}); val_loss fixed {fixed.metrics['val_loss']:.4f}, resized "
                      f"{resized.metrics['val_loss']:.4f}; resized attempts: {headings}", flush=True)
            print(f"  {framework}: resized minus fixed val_accuracy {' '.join(f'{d:+.3f}' for d in differences)}; "
                  f"median {statistics.median(differences):+.3f}, largest {max(differences, key=abs):+.3f}",
                  flush=True)
    print(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
