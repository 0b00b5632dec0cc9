"""PyTorch Lightning against the Keras trainer, in one run each:

(1) input pipeline: images/s the Lightning trainer's reader delivers (TrainBatches: the Keras trainer's Petastorm
    reader and row shuffle, batches as whole uint8 tensors made in a background thread) against a bare pyarrow read of the same Parquet files, as in
    bench/input_pipeline.py (299x299x3 rows, batch 32); rounds interleaved, medians.
(2) training throughput: both trainers, as the quick start runs them (EfficientNet-Lite0 frozen with the ImageNet
    weights, Fashion-MNIST at --size, batch --batch per process, --np processes), on the same local Parquet:
    horovodrun (Keras, .venv) and mpirun (Lightning, .venv-lightning); the progress documents' images/s of
    the epochs after the first (which includes start-up), medians, as a ratio; --training-rounds N runs the
    pair N times, interleaved, and reports each round's ratio and their median.
(3) --model: the frozen base's forward pass alone, one thread, batch --batch at --size: PyTorch with the weights
    in the previous layout (NCHW, under autograd) and as the trainer has them now (channels-last, no autograd),
    and Keras (TensorFlow, inter/intra-op threads 1); rounds interleaved, medians.

Run: .venv/bin/python bench/lightning.py [--rows 1024] [--batches 256] [--rounds 3] [--per-class 100] [--epochs 3]
     [--training-rounds 1] [--model] [--skip-input] [--skip-training]
(needs both venvs: scripts/setup.sh and SCALINGRUN_PROFILE=lightning scripts/setup.sh)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalingrun_api.progress import PROGRESS_FILE, Progress

ROOT = Path(__file__).resolve().parents[1]
LIGHTNING_PYTHON = Path(os.environ.get("SCALINGRUN_LIGHTNING_PYTHON", ROOT / ".venv-lightning/bin/python"))
SIDE = 299
BATCH = 32


def preprocess(folder: Path, per_class: int, side: int, readers: int, seed: int = 42) -> str:
    """Fashion-MNIST JPEGs under folder/jpeg (written once), preprocessed with `seed` (the split and row order)."""
    from scalingrun_trainer.preprocess.shards import Params, process_shard
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    source = folder / "jpeg"
    if not source.exists():
        for relative, data in fashion_mnist_jpegs(per_class):
            (source / relative).parent.mkdir(parents=True, exist_ok=True)
            (source / relative).write_bytes(data)
    output = folder / f"parquet-{seed}"
    process_shard(Params(str(source), str(output), image_size=side, validation_fraction=0.1, max_readers=readers,
                         seed=seed), 0, 1)
    return str(output)


def input_worker(output: str, batches: int, rounds: int) -> None:
    """In the Lightning venv: the trainer's reader vs a bare pyarrow read, rounds interleaved."""
    from input_rates import interleaved_rates

    rates = interleaved_rates(output, BATCH, batches, rounds)
    print(json.dumps({"bare": rates["bare"], "lightning": rates["reader"]}))


def model_worker(framework: str, size: int, batch: int, repeats: int) -> None:
    """One thread: images/s of the frozen base's forward pass (as training runs it), printed as JSON."""
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    if framework == "keras":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        from scalingrun_trainer.frameworks.keras.models import build_model

        model = build_model("efficientnet_lite0", size, 10, "imagenet", 0.2, trainable_base=False)
        forward = {"keras": tf.function(lambda x: model(x, training=True))}
        data = tf.constant(pixels)
    else:
        import copy

        import torch

        from scalingrun_trainer.frameworks.lightning.efficientnet_lite import load_base_weights
        from scalingrun_trainer.frameworks.lightning.model import TransferNet

        torch.set_num_threads(1)
        net = TransferNet(10, 0.2)
        load_base_weights(net.base, "imagenet")
        net.base.requires_grad_(False)
        net.frozen_base = True
        net.train()
        net.base.eval()
        previous = copy.deepcopy(net).to(memory_format=torch.contiguous_format)
        previous.frozen_base = False
        forward = {"previous": previous.logits, "now": net.logits}
        data = torch.from_numpy(pixels)
    rates: dict[str, list[float]] = {name: [] for name in forward}
    for name, run in forward.items():
        run(data)  # warm-up: tracing, oneDNN's kernel choice
    for _ in range(repeats):
        for name, run in forward.items():
            start = time.perf_counter()
            run(data)
            rates[name].append(batch / (time.perf_counter() - start))
    print(json.dumps(rates))


def model_bench(args) -> None:
    """(3): the two venvs' forward passes, alternating, 3 repeats per round."""
    rates: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for python, framework in ((LIGHTNING_PYTHON, "pytorch"), (Path(sys.executable), "keras")):
            result = subprocess.run([str(python), __file__, "--model-worker", framework, str(args.size), str(args.batch)],
                                    capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
            if result.returncode:
                raise SystemExit(result.stderr[-3000:])
            for name, values in json.loads(result.stdout.strip().splitlines()[-1]).items():
                rates.setdefault(name, []).extend(values)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"model: the frozen EfficientNet-Lite0 base's forward, batch {args.batch} at {args.size}x{args.size}, one "
          f"thread; medians of {len(rates['keras'])}")
    for name, label in (("keras", "Keras (TensorFlow)"), ("previous", "PyTorch, previous layout"),
                        ("now", "PyTorch now (BN folded)")):
        print(f"  {label:26s} : {medians[name]:8.1f} img/s  {medians[name] / medians['keras']:.2f} x Keras  "
              f"({' '.join(f'{r:.0f}' for r in rates[name])})")


def train_rate(command: list[str], run: Path, **env: str) -> list[float]:
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env})
    progress = run / PROGRESS_FILE
    if result.returncode or not progress.exists():
        raise SystemExit(f"{command[0]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return [entry.images_per_second for entry in Progress.read(json.loads(progress.read_text())).history]


def config_for(folder: Path, output: str, framework: str, args) -> Path:
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders.config import build_trainer_config

    spec = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": f"bench-{framework}"},
            "spec": {"dataset": {"source": str(folder / "jpeg"), "output": output, "imageSize": args.size},
                     "model": {"base": "efficientnet_lite0", "weights": "imagenet", "dropout": 0.2},
                     "training": {"framework": framework, "batchSizePerWorker": args.batch, "maxEpochs": args.epochs,
                                  "featureCache": "off",  # the whole network every epoch: what is compared
                                  "earlyStopping": {"enabled": False}, "resume": False,
                                  "checkpoint": {"location": str(folder / "runs" / framework)}},
                     "workers": {"replicas": args.np, "gpusPerWorker": 0}}}
    path = folder / f"{framework}.json"
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lightning-threads", type=int,
                        help="torch threads per Lightning process (OMP_NUM_THREADS); default: cores / processes")
    parser.add_argument("--skip-keras", action="store_true", help="train only the Lightning trainer")
    parser.add_argument("--training-rounds", type=int, default=1)
    parser.add_argument("--model", action="store_true", help="also (3), the base's forward pass alone")
    parser.add_argument("--model-worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-input", action="store_true")
    parser.add_argument("--input-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.input_worker:
        input_worker(args.input_worker[0], int(args.input_worker[1]), int(args.input_worker[2]))
        return
    if args.model_worker:
        model_worker(args.model_worker[0], int(args.model_worker[1]), int(args.model_worker[2]), 3)
        return
    if not LIGHTNING_PYTHON.exists():
        raise SystemExit(f"no {LIGHTNING_PYTHON}: run SCALINGRUN_PROFILE=lightning scripts/setup.sh")
    with tempfile.TemporaryDirectory(prefix="bench-lightning-") as folder:
        if not args.skip_input:
            input_bench(folder, args)
        if args.model:
            model_bench(args)
        if args.skip_training:
            return
        train_dir = Path(folder) / "train"
        data = preprocess(train_dir, args.per_class, args.size, args.np)
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        mpirun = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", str(args.np),
                  "--oversubscribe", "-bind-to", "none"]
        threads = {"OMP_NUM_THREADS": str(args.lightning_threads)} if args.lightning_threads else {}
        keras_command = [horovodrun, "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo", sys.executable, "-m",
                         "scalingrun_trainer.cli", "train", "--config", str(config_for(train_dir, data, "keras", args))]
        lightning_command = [*mpirun, *(["-x", "OMP_NUM_THREADS"] if threads else []), str(LIGHTNING_PYTHON), "-m",
                             "scalingrun_trainer.cli", "train", "--config",
                             str(config_for(train_dir, data, "pytorch-lightning", args))]
        print(f"training, {args.per_class * 10} Fashion-MNIST images at {args.size}x{args.size}, EfficientNet-Lite0 "
              f"frozen, {args.np} processes x batch {args.batch}, epochs 2..{args.epochs} (median)"
              + (f", {args.lightning_threads} torch threads per Lightning process" if threads else ""))
        ratios = []
        for round_ in range(1, args.training_rounds + 1):
            for run in ("keras", "pytorch-lightning"):  # a rerun must not resume the previous round's run
                shutil.rmtree(train_dir / "runs" / run, ignore_errors=True)
            keras = [] if args.skip_keras else train_rate(keras_command, train_dir / "runs/keras")
            lightning = train_rate(lightning_command, train_dir / "runs/pytorch-lightning", **threads)
            lt = statistics.median(lightning[1:] or lightning)
            line = f"  round {round_}: "
            if keras:
                k = statistics.median(keras[1:] or keras)
                ratios.append(lt / k)
                line += f"Keras + Horovod {k:6.1f} img/s ({' '.join(f'{r:.0f}' for r in keras)}), "
            line += f"PyTorch Lightning DDP {lt:6.1f} img/s ({' '.join(f'{r:.0f}' for r in lightning)})"
            print(line + (f": {lt / k:.2f} x Keras" if keras else ""), flush=True)
        if ratios:
            print(f"  Lightning / Keras: {statistics.median(ratios):.2f} (median of {len(ratios)} rounds: "
                  f"{' '.join(f'{r:.2f}' for r in ratios)})")


def input_bench(folder: str, args) -> None:
    """(1): the Lightning reader against a bare pyarrow read, in the Lightning venv."""
    output = preprocess(Path(folder) / "input", args.rows // 10 + 1, SIDE, 4)
    result = subprocess.run([str(LIGHTNING_PYTHON), __file__, "--input-worker", output, str(args.batches),
                             str(args.rounds)], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr[-3000:])
    rates = json.loads(result.stdout.strip().splitlines()[-1])
    bare, ours = statistics.median(rates["bare"]), statistics.median(rates["lightning"])
    print(f"input, {args.rows} rows of {SIDE}x{SIDE}x3, batch {BATCH}; medians of {args.rounds} rounds")
    print(f"  bare pyarrow read          : {bare:8.0f} img/s  ({' '.join(f'{r:.0f}' for r in rates['bare'])})")
    print(f"  Lightning reader           : {ours:8.0f} img/s  {ours / bare:.2f} x bare  "
          f"({' '.join(f'{r:.0f}' for r in rates['lightning'])})")


if __name__ == "__main__":
    main()
