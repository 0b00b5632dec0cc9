"""spec.training.featureCache: training with the frozen base run once (auto) against the whole network every epoch
(off), same data, model, processes and batch, in one run, for each framework whose venv exists:

- epoch images/s: the progress document's, epochs 2..N (the first includes start-up), median;
- training seconds: the progress document's elapsedSeconds when the run succeeded (from the start of training to
  the saved model; with the cache, its one pass over the images included), and the cache's own seconds;
- the last epoch's val_accuracy of both (the cache changes the speed, not the model).

With --rounds N the two modes alternate N times (load from other work spreads over both); figures are the median
round's by training seconds (of two, the faster). With --seeds A,B,... the data is preprocessed once per seed
(another split, row order, head initialisation, batch order and dropout masks) and both modes train on each:
every pair's last val_accuracy and val_loss are printed with their differences, auto minus off, then per metric the
medians each way, the differences' median and range, and the spread between seeds of each mode (what "the same
result" is measured against: docs/feature-cache.md).

Keras runs under horovodrun (.venv), Keras + MultiWorkerMirroredStrategy (`--frameworks keras-mirrored`) under
mpirun (.venv), Lightning under mpirun (.venv-lightning); the model is EfficientNet-Lite0 with
the ImageNet weights, frozen (the quick start's), on Fashion-MNIST preprocessed to --size.

Run: .venv/bin/python bench/feature_cache.py [--per-class 30] [--size 96] [--batch 32] [--np 2] [--epochs 3]
     [--rounds 1] [--seeds 42] [--frameworks keras,pytorch-lightning,keras-mirrored]
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
from bench.lightning import LIGHTNING_PYTHON, preprocess  # noqa: E402 - the same data as the Lightning bench
from scalingrun_api.progress import PROGRESS_FILE, Progress  # noqa: E402

MODES = ("off", "auto")
# --frameworks names an engine: the spec's framework and strategy.
ENGINES = {"keras": ("keras", "horovod"), "keras-mirrored": ("keras", "multi-worker-mirrored"),
           "pytorch-lightning": ("pytorch-lightning", "ddp")}


def config_for(folder: Path, output: str, name: str, framework: str, mode: str, args, seed: int) -> Path:
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders.config import build_trainer_config

    spec = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": f"bench-{name}"},
            "spec": {"dataset": {"source": str(folder / "jpeg"), "output": output, "imageSize": args.size, "seed": seed},
                     "model": {"base": "efficientnet_lite0", "weights": "imagenet", "dropout": 0.2},
                     "training": {"framework": ENGINES[framework][0], "strategy": ENGINES[framework][1],
                                  "batchSizePerWorker": args.batch, "maxEpochs": args.epochs,
                                  "featureCache": mode, "earlyStopping": {"enabled": False}, "resume": False,
                                  "checkpoint": {"location": str(folder / "runs" / name)}},
                     "workers": {"replicas": args.np, "gpusPerWorker": 0}}}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def command(framework: str, processes: int, config: Path) -> list[str]:
    train = ["-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    if framework == "keras":
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        return [horovodrun, "-np", str(processes), "-H", f"localhost:{processes}", "--gloo", sys.executable, *train]
    mpirun = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", str(processes),
              "--oversubscribe", "-bind-to", "none"]
    return [*mpirun, sys.executable if framework == "keras-mirrored" else str(LIGHTNING_PYTHON), *train]


def train(framework: str, mode: str, folder: Path, output: str, args, round_: int, seed: int) -> tuple[Progress, float]:
    """The finished run's progress document and the command's wall seconds (process start-up included)."""
    name = f"{framework}-{mode}-{seed}-{round_}"
    config = config_for(folder, output, name, framework, mode, args, seed)
    started = time.monotonic()
    result = subprocess.run(command(framework, args.np, config), capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    wall = time.monotonic() - started
    progress_file = folder / "runs" / name / PROGRESS_FILE
    if result.returncode or not progress_file.exists():
        raise SystemExit(f"{framework} {mode} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    progress = Progress.read(json.loads(progress_file.read_text()))
    if (progress.feature_cache is None or progress.feature_cache.used is not (mode == "auto")
            or len(progress.history) != args.epochs):
        raise SystemExit(f"{framework} {mode}: unexpected progress document {progress.document()}")
    return progress, wall


def epoch_rate(progress: Progress) -> float:
    rates = [entry.images_per_second for entry in progress.history]
    return statistics.median(rates[1:] or rates)


def median_round(runs: list[tuple[Progress, float]]) -> tuple[Progress, float]:
    return sorted(runs, key=lambda run: run[0].elapsed_seconds)[(len(runs) - 1) // 2]


METRICS = ("val_accuracy", "val_loss")


def spread(values: list[float]) -> str:
    """A sample's range and standard deviation, as the summary prints them."""
    return f"{min(values):.3f}..{max(values):.3f} (range {max(values) - min(values):.3f}, sd {statistics.stdev(values):.3f})"


def spread_summary(framework: str, args, metric: str, finals: dict[str, list[float]]) -> str:
    """One line to set the cache's effect beside the seeds' own: the medians of the last epoch's `metric` each way,
    the paired differences (auto minus off, same seed) and how far the seeds alone move it without the cache."""
    differences = [auto - off for auto, off in zip(finals["auto"], finals["off"])]
    return (f"    summary {framework}, {args.per_class * 10} images x {args.epochs} epochs, {len(differences)} seeds, "
            f"{metric}: median off {statistics.median(finals['off']):.3f}, auto {statistics.median(finals['auto']):.3f}; "
            f"auto - off median {statistics.median(differences):+.3f}, {min(differences):+.3f}..{max(differences):+.3f} "
            f"(sd {statistics.stdev(differences):.3f}); between seeds, off {spread(finals['off'])}, "
            f"auto {spread(finals['auto'])}")


def available_frameworks(names: str) -> list[str]:
    """The comma-separated frameworks asked for, less Lightning when its venv is missing (said so)."""
    frameworks = names.split(",")
    if "pytorch-lightning" in frameworks and not LIGHTNING_PYTHON.exists():
        print(f"no {LIGHTNING_PYTHON} (SCALINGRUN_PROFILE=lightning scripts/setup.sh): Keras only")
        frameworks.remove("pytorch-lightning")
    return frameworks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=30)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seeds", default="42", help="comma-separated dataset seeds, one preprocessing each")
    parser.add_argument("--frameworks", default="keras,pytorch-lightning")
    args = parser.parse_args()
    frameworks = available_frameworks(args.frameworks)
    with tempfile.TemporaryDirectory(prefix="bench-feature-cache-") as folder:
        data_dir = Path(folder)
        seeds = [int(seed) for seed in args.seeds.split(",")]
        outputs = {seed: preprocess(data_dir, args.per_class, args.size, args.np, seed) for seed in seeds}
        print(f"{args.per_class * 10} Fashion-MNIST images at {args.size}x{args.size}, EfficientNet-Lite0 frozen "
              f"(ImageNet), {args.np} processes x batch {args.batch}, {args.epochs} epochs, {args.rounds} round(s), "
              f"seeds {seeds}; featureCache off is the baseline", flush=True)
        for framework in frameworks:
            rounds: dict[str, list[tuple[Progress, float]]] = {mode: [] for mode in MODES}
            differences = []
            # The last epoch's metrics of every pair, per mode and metric (the summary's spread).
            finals: dict[str, dict[str, list[float]]] = {metric: {mode: [] for mode in MODES} for metric in METRICS}
            for seed in seeds:
                for round_ in range(args.rounds):
                    pair = {}
                    for mode in MODES:
                        pair[mode] = train(framework, mode, data_dir, outputs[seed], args, round_, seed)
                        rounds[mode].append(pair[mode])
                    accuracy = {mode: progress.metrics.get("val_accuracy", float("nan"))
                                for mode, (progress, _) in pair.items()}
                    differences.append(accuracy["auto"] - accuracy["off"])
                    for metric in METRICS:
                        for mode, (progress, _) in pair.items():
                            finals[metric][mode].append(progress.metrics.get(metric, float("nan")))
                    if len(seeds) > 1 or args.rounds > 1:
                        loss = {mode: progress.metrics.get("val_loss", float("nan")) for mode, (progress, _) in pair.items()}
                        print(f"    {framework} seed {seed} round {round_ + 1}: val_accuracy off {accuracy['off']:.3f}, "
                              f"auto {accuracy['auto']:.3f} ({differences[-1]:+.3f}); val_loss off {loss['off']:.4f}, "
                              f"auto {loss['auto']:.4f} ({loss['auto'] - loss['off']:+.4f}); training "
                              f"{pair['off'][0].elapsed_seconds:.1f} s against {pair['auto'][0].elapsed_seconds:.1f} s",
                              flush=True)
            runs = {mode: median_round(found) for mode, found in rounds.items()}
            (off, off_wall), (auto, auto_wall) = runs["off"], runs["auto"]
            print(f"  {framework}")
            for mode, (progress, wall) in runs.items():
                cache = progress.feature_cache
                cost = f", cache {cache.seconds:.1f} s / {cache.bytes / 1e6:.1f} MB" if cache.used else ""
                print(f"    {mode:4}: {epoch_rate(progress):8.1f} img/s epochs 2..{args.epochs} "
                      f"({' '.join(f'{e.images_per_second:.0f}' for e in progress.history)}); training "
                      f"{progress.elapsed_seconds:6.1f} s{cost}; command {wall:5.1f} s; "
                      f"val_accuracy {progress.metrics.get('val_accuracy', float('nan')):.3f}")
            print(f"    ratio: {epoch_rate(auto) / epoch_rate(off):.1f} x the epoch images/s, "
                  f"{off.elapsed_seconds / auto.elapsed_seconds:.2f} x faster training, "
                  f"{off_wall / auto_wall:.2f} x faster command (auto against off)")
            if len(differences) > 1:
                print(f"    val_accuracy, auto minus off, per pair: {' '.join(f'{d:+.3f}' for d in differences)}; "
                      f"mean {statistics.mean(differences):+.3f}, largest {max(differences, key=abs):+.3f}")
                for metric in METRICS:
                    print(spread_summary(framework, args, metric, finals[metric]), flush=True)


if __name__ == "__main__":
    main()
