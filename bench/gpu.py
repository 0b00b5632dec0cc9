"""The GPU check in one call (issue 31, item 10; issue 29's frozen rank under NCCL): on a machine with one GPU,

(1) data made on the spot: synthetic JPEGs (a colour and a stripe pattern per class, noise) preprocessed into our
    Parquet layout by our own preprocessing (scalingrun_trainer.preprocess);
(2) the input pipeline's rate: the Lightning trainer's reader (lightning.data.TrainBatches) alone, and a bare pyarrow
    read of the same files, as bench/lightning.py measures them;
(3) training through our own entry point (`python -m scalingrun_trainer.cli train --config`, under mpirun when
    there is one) with a config rendered as the operator renders it (build_trainer_config), EfficientNet-Lite0 frozen
    (random weights: the ImageNet ones do not travel; the speed is the same), featureCache off and auto, on the GPU
    and on the CPU (CUDA hidden); images/s are the progress document's, median of the epochs after the first;
(4) the frozen rank: 2 ranks, rank 1 SIGSTOPped mid-epoch, the seconds until the launcher exits non-zero.
    Under NCCL two ranks need two GPUs (NCCL refuses two ranks on one device): a 2-rank NCCL all-reduce on cuda:0 is
    tried first and its error reported when it fails. SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS (the engines' stall
    watch, when the trainer has it) is passed to the ranks; --frozen-timeout sets it.

It ends with one Markdown table naming the device, also written to $OUT/gpu-bench.md (and .json) when OUT is set.

Run (GPU machine, see docs/benchmarks.md "On a GPU"): bash bench/gpu.sh
Dry run on CPU (tests/lightning/test_gpu_bench.py): python bench/gpu.py --dry-run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from gpu_runs import SOURCES, TIMEOUT_VARIABLE, frozen_rank, nccl_pair, say, train, trainer_env

sys.path[:0] = SOURCES  # our sources first, as the trainer's processes get them (gpu_runs.trainer_env)


def environment() -> dict:
    """What the table names: the device, the versions, MPI."""
    import numpy
    import pyarrow
    import pytorch_lightning
    import torch

    facts = {"python": sys.version.split()[0], "torch": torch.__version__, "lightning": pytorch_lightning.__version__,
             "numpy": numpy.__version__, "pyarrow": pyarrow.__version__, "host": socket.gethostname(),
             "cpus": len(os.sched_getaffinity(0)), "cuda": torch.cuda.is_available()}
    if facts["cuda"]:
        facts["gpu"] = f"{torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} visible)"
    probe = subprocess.run([sys.executable, "-c", "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()"
                            "[0])"], capture_output=True, text=True, timeout=120, env=trainer_env())
    version = probe.stdout.replace("\x00", "").strip()
    facts["mpi"] = version if probe.returncode == 0 else f"unusable: {probe.stderr.strip()[-300:]}"
    facts["mpirun"] = shutil.which("mpirun")
    return facts


def make_images(folder: Path, count: int, side: int, classes: int = 10, seed: int = 0) -> Path:
    """`count` JPEGs under folder/<class>/: each class its own colour and stripe period, with noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.arange(side)
    for index in range(count):
        label = index % classes
        colour = np.array([(label * 37) % 256, (label * 91) % 256, (label * 53) % 256], dtype=np.float32)
        stripes = ((ramp // (2 + label)) % 2 * 60.0)[None, :, None]
        pixels = np.clip(colour + stripes + rng.normal(0, 25, (side, side, 3)), 0, 255).astype(np.uint8)
        target = folder / f"class{label}" / f"{index:05d}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(target, quality=90)
    return folder


def preprocess(source: Path, output: Path, size: int, readers: int) -> str:
    from scalingrun_trainer.preprocess.shards import Params, process_shard

    process_shard(Params(str(source), str(output), image_size=size, validation_fraction=0.1, max_readers=readers,
                         seed=42), 0, 1, workers=min(8, len(os.sched_getaffinity(0))))
    return str(output)


def input_rates(output: str, batch: int, batches: int, rounds: int) -> dict[str, float]:
    """images/s: our reader (what the trainer feeds the model from) and a bare pyarrow read; medians of rounds."""
    from input_rates import interleaved_rates

    rates = interleaved_rates(output, batch, batches, rounds)
    return {name: statistics.median(values) for name, values in rates.items()}


def render_config(folder: Path, source: Path, data: str, name: str, *, size: int, batch: int, epochs: int,
                  cache: str, replicas: int, gpus: int) -> Path:
    """config.json as the operator renders it for a ScalingRun (builders/config.py)."""
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders.config import build_trainer_config

    spec = {"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun", "metadata": {"name": name},
            "spec": {"dataset": {"source": str(source), "output": data, "imageSize": size},
                     "model": {"base": "efficientnet_lite0", "weights": "none", "dropout": 0.2},
                     "training": {"framework": "pytorch-lightning", "batchSizePerWorker": batch, "maxEpochs": epochs,
                                  "featureCache": cache, "earlyStopping": {"enabled": False}, "resume": False,
                                  "checkpoint": {"location": str(folder / "runs" / name)}},
                     "workers": {"replicas": replicas, "gpusPerWorker": gpus}}}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(build_trainer_config(parse_scalingrun(spec))))
    return path


def _number(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:,.1f}{unit}"


class Table(list):
    """The table's rows; each one added is written out at once ($OUT/gpu-bench.md), so that a check cut short by
    the device call's limit still returns what it measured."""

    def __init__(self, facts: dict):
        super().__init__()
        self.facts = facts

    def append(self, row: list[str]) -> None:
        super().append(row)
        say(" | ".join(row))
        publish(self.facts, self)


def publish(facts: dict, rows: list[list[str]]) -> str:
    text = table(facts, rows)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "gpu-bench.md").write_text(text + "\n")
        Path(os.environ["OUT"], "gpu-bench.json").write_text(json.dumps({"facts": facts, "rows": rows}, indent=1))
    return text


def run(args) -> tuple[dict, list[list[str]]]:
    facts = environment()
    say(f"environment: {facts}")
    devices = ["cpu"] if args.device == "cpu" or not facts["cuda"] else ["cuda", "cpu"]
    rows = Table(facts)
    folder = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    try:
        started = time.perf_counter()
        source = make_images(folder / "jpeg", args.images, args.source_side)
        data = preprocess(source, folder / "parquet", args.size, 2)
        rows.append(["data", "-", f"{args.images} synthetic JPEGs, {args.size}x{args.size}",
                     f"{time.perf_counter() - started:.1f} s", "made and preprocessed by our code"])
        say("data made; measuring the input pipeline")
        rates = input_rates(data, args.batch, args.input_batches, args.rounds)
        rows.append(["input pipeline: our reader (TrainBatches)", "cpu", f"batch {args.batch}",
                     _number(rates["reader"], " img/s"), f"median of {args.rounds}"])
        rows.append(["input pipeline: bare pyarrow read", "cpu", f"batch {args.batch}",
                     _number(rates["bare"], " img/s"), "upper bound of reading"])
        results: dict[tuple[str, str], dict] = {}
        for device in devices:
            for cache in args.caches:
                name = f"train-{device}-{cache}"
                epochs = args.epochs if device == "cuda" else args.cpu_epochs
                config = render_config(folder, source, data, name, size=args.size, batch=args.batch, epochs=epochs,
                                       cache=cache, replicas=1, gpus=1 if device == "cuda" else 0)
                label = f"training: 1 process, featureCache {cache}"
                say(f"{label} on {device}")
                try:
                    result = train(folder, config, name, args.run_limit,
                                   **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {}))
                except RuntimeError as exc:
                    rows.append([label, device, f"batch {args.batch}", "failed", str(exc)[-300:].replace("\n", " ")])
                    continue
                results[device, cache] = result
                notes = [f"{result['rate'] / rates['reader']:.3g} x reader",
                         "epochs " + " ".join(f"{rate:.0f}" for rate in result["epochs"])]
                if result["input_wait"] is not None:
                    notes.append(f"input wait {result['input_wait']:.0%}")
                if result["gpu_utilization"] is not None:
                    notes.append(f"GPU busy {result['gpu_utilization']:.0f}%")
                if result["cache_used"]:
                    notes.append(f"features cached in {_number(result['cache_seconds'], ' s')}")
                rows.append([label, device, f"batch {args.batch}", _number(result["rate"], " img/s"),
                             "; ".join(notes)])
        for cache in args.caches:
            if ("cuda", cache) in results and ("cpu", cache) in results:
                rows.append([f"GPU against CPU, featureCache {cache}", "cuda/cpu", "-",
                             f"{results['cuda', cache]['rate'] / results['cpu', cache]['rate']:.2f} x", ""])
        for device in devices:
            if (device, "auto") in results and (device, "off") in results:
                rows.append([f"featureCache auto against off", device, "-",
                             f"{results[device, 'auto']['rate'] / results[device, 'off']['rate']:.2f} x", ""])
        if not args.skip_frozen:
            rows.append(frozen_row(args, facts, folder, source, data))
    except Exception as exc:  # a step everything after it needs (the data, the reader): said in the table
        traceback.print_exc()
        rows.append(["stopped here", "-", "-", "failed", f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")])
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return facts, rows


def frozen_row(args, facts: dict, folder: Path, source: Path, data: str) -> list[str]:
    backend = args.frozen_backend or ("nccl" if facts["cuda"] and args.device != "cpu" else "gloo")
    label = f"frozen rank: 2 ranks, rank 1 SIGSTOPped mid-epoch ({backend})"
    setting = f"{TIMEOUT_VARIABLE}={args.frozen_timeout}"
    say(label)
    if backend == "nccl":
        possible, why = nccl_pair()
        if not possible:
            return [label, "cuda", setting, "not possible", f"2 NCCL ranks on one GPU: {why}"]
    if not shutil.which("mpirun"):
        return [label, backend, setting, "skipped", "no mpirun on PATH"]
    name = f"frozen-{backend}"
    config = render_config(folder, source, data, name, size=args.size, batch=args.batch, epochs=1000, cache="off",
                           replicas=2, gpus=1 if backend == "nccl" else 0)
    try:
        result = frozen_rank(folder, config, name, args.frozen_timeout, args.frozen_limit, backend == "gloo")
    except RuntimeError as exc:
        return [label, backend, setting, "failed", str(exc)[-300:].replace("\n", " ")]
    device = "cuda" if backend == "nccl" else "cpu"
    if result["exit"] is None:
        return [label, device, setting, f"> {result['limit']:.0f} s", "still running at the limit: killed"]
    return [label, device, setting, _number(result["seconds"], " s"),
            f"launcher exit {result['exit']}: {result['tail']}"]


def table(facts: dict, rows: list[list[str]]) -> str:
    device = facts.get("gpu") or f"CPU only ({facts['cpus']} cores)"
    lines = [f"GPU check on **{device}**, {facts['cpus']} CPU cores, host {facts['host']}; Python {facts['python']}, "
             f"torch {facts['torch']}, Lightning {facts['lightning']}, numpy {facts['numpy']}, pyarrow "
             f"{facts['pyarrow']}; MPI: {facts['mpi']}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             "| measurement | device | setting | result | notes |", "| --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["auto", "cpu"], default="auto", help="cpu: the CPU runs only")
    parser.add_argument("--dry-run", action="store_true", help="small sizes on the CPU (the test's)")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--source-side", type=int, default=256, help="side of the generated JPEGs")
    parser.add_argument("--size", type=int, default=224, help="dataset.imageSize")
    parser.add_argument("--batch", type=int, default=64, help="training.batchSizePerWorker")
    parser.add_argument("--epochs", type=int, default=4, help="epochs of the GPU runs")
    parser.add_argument("--cpu-epochs", type=int, default=2, help="epochs of the CPU runs")
    parser.add_argument("--caches", nargs="+", default=["off", "auto"], choices=["off", "auto"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--input-batches", type=int, default=40)
    parser.add_argument("--run-limit", type=float, default=300, help="seconds one training run may take")
    parser.add_argument("--skip-frozen", action="store_true")
    parser.add_argument("--frozen-backend", choices=["nccl", "gloo"], help="default: nccl with a GPU, else gloo")
    parser.add_argument("--frozen-timeout", type=int,
                        default=int(os.environ.get(TIMEOUT_VARIABLE, os.environ.get("GPU_BENCH_TIMEOUT", "60"))),
                        help=f"{TIMEOUT_VARIABLE} for the ranks (default: that variable, else 60)")
    parser.add_argument("--frozen-limit", type=float, default=240, help="seconds to wait for the launcher's exit")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, progress)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
        small = {"images": 120, "source_side": 48, "size": 32, "batch": 16, "cpu_epochs": 2, "rounds": 1,
                 "input_batches": 8}
        for name, value in small.items():
            if parser.get_default(name) == getattr(args, name):
                setattr(args, name, value)
    facts, rows = run(args)
    print(publish(facts, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
