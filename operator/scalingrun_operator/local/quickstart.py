"""The quick start: a local S3 server, Fashion-MNIST as a JPEG tree in a bucket, then
`scalingrun run --local` of examples/quickstart.yaml. Data stays under .scalingrun/quickstart, so a
second run reuses the uploaded images and the preprocessed dataset (same fingerprint).

Needs the full stack (scripts/setup.sh); imports of the trainer side stay inside functions so that
the operator package keeps importing without it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scalingrun_api.progress import Progress
from ..schema import strict_yaml
from ..schema.validation import parse_scalingrun
from ..builders.locations import progress_uri
from .keep import Kept, keep
from .runner import LocalRun
from .s3server import S3Server
from .signals import Stopped, stop_on_signals

UPLOAD_MARKER = "_uploaded.json"


def _credentials(state: Path) -> tuple[str, str]:
    """Random keys made once per machine and kept 0600, so that the stored data stays readable."""
    path = state / "credentials.json"
    if not path.exists():
        state.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps({"accessKey": "quickstart-" + secrets.token_hex(4),
                                    "secretKey": secrets.token_hex(20)}))
    keys = json.loads(path.read_text())
    return keys["accessKey"], keys["secretKey"]


def upload_fashion_mnist(server: S3Server, source_uri: str, per_class: int) -> int:
    """Fashion-MNIST training images as JPEGs under SOURCE/<class>/; skipped when already there."""
    from pyarrow import fs as pafs

    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    s3 = server.filesystem()
    prefix = source_uri[len("s3://"):].rstrip("/")
    marker = f"{prefix}/{UPLOAD_MARKER}"
    if s3.get_file_info(marker).type == pafs.FileType.File:
        done = json.loads(s3.open_input_stream(marker).read())
        if done.get("perClass") == per_class:
            return 0
    server.create_bucket(prefix.split("/", 1)[0])

    def put(item: tuple[str, bytes]) -> None:
        with s3.open_output_stream(f"{prefix}/{item[0]}") as stream:
            stream.write(item[1])

    with ThreadPoolExecutor(8) as pool:
        count = sum(1 for _ in pool.map(put, fashion_mnist_jpegs(per_class, split="train")))
    with s3.open_output_stream(marker) as stream:
        stream.write(json.dumps({"perClass": per_class, "files": count}).encode())
    return count


def print_summary(local: LocalRun, run, state: Path, report, total_seconds: float, kept: Kept = Kept()) -> None:
    status, pre, progress = local.status, local.status.preprocessing, local.progress or Progress()
    print("\n== quick start summary ==")
    print(f"phase: {status.phase}")
    if pre:
        print(f"preprocessing: {pre.images_written} images written, {pre.images_skipped} skipped, {pre.classes} "
              f"classes, {local.seconds.get('preprocessing', 0):.0f} s{' (dataset reused)' if pre.reused else ''}")
    if progress.history:
        best = progress.best_metrics
        print(f"training: {progress.epoch} of {progress.max_epochs} epochs, best epoch {progress.best_epoch}, "
              f"val_accuracy {best.get('val_accuracy', float('nan')):.4f}, {progress.processes} processes, "
              f"{progress.images_per_second} img/s (last epoch), {local.seconds.get('training', 0):.0f} s")
    for condition in status.conditions:
        if condition.status != "True" or condition.type == "Failed":
            print(f"  {condition.type}={condition.status} {condition.reason}: {condition.message}")
    print(f"Parquet dataset: {run.spec.dataset.output} (SeaweedFS data in {state / 'seaweedfs'})")
    if kept.model:
        print(f"model: {kept.model} (copied from {progress.model_uri}: the store stops with the quick start)")
    elif progress.model_uri:
        print(f"model: {progress.model_uri}")
    if kept.progress:
        print(f"progress document: {kept.progress} (scalingrun report -f reads it)")
    if report:
        print(f"report: {report[0]} and {report[1]}")
    print(f"status document: {local.status_path}")
    print(f"total time: {total_seconds:.0f} s")


def _sweep(run, workers: str, state: Path, started: float) -> int:
    """The quick-start run as the template of a local ScalingSweep over `workers` (e.g. "1,2")."""
    from ..schema.validation import parse_scalingsweep
    from ..report.sweep import print_sweep
    from .sweep import LocalSweep

    try:
        counts = [int(w) for w in workers.split(",")]
    except ValueError:
        print(f"--sweep: worker counts separated by commas, e.g. 1,2 (got {workers!r})", file=sys.stderr)
        return 2
    sweep = parse_scalingsweep({
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep",
        "metadata": {"name": run.metadata.name},  # points quickstart-w1, -w2; report quickstart-sweep.png
        "spec": {"workers": counts, "template": run.spec.model_dump(mode="json", by_alias=True, exclude_none=True)}})
    local = LocalSweep(sweep, state / "sweeps" / sweep.metadata.name)
    code = local.start()
    print_sweep(sweep.metadata.name, local.rows, local.recommendation, local.notes, sweep.spec.efficiency_threshold,
                state / "reports")
    print(f"total time: {time.monotonic() - started:.0f} s")
    return code


def main(argv: list[str] | None = None) -> int:
    """The quick start; on SIGTERM or SIGINT it stops the run's processes and its SeaweedFS, then exits 143 or
    130 (signals.Stopped)."""
    try:
        with stop_on_signals():
            return _main(argv)
    except Stopped as stopped:
        print(f"quick start: stopped by {stopped.name}; the run's processes and SeaweedFS are stopped",
              file=sys.stderr)
        return stopped.exit_code


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="scalingrun-quickstart", description=__doc__)
    parser.add_argument("-f", "--filename", default="examples/quickstart.yaml")
    parser.add_argument("--state", default=".scalingrun/quickstart", help="S3 data and run documents")
    parser.add_argument("--per-class", type=int, default=1000, help="Fashion-MNIST images per class")
    parser.add_argument("--stop-after", choices=["preprocessing", "training"], default="training")
    parser.add_argument("--np", type=int, help="training processes (default from the spec)")
    parser.add_argument("--sweep", help="instead of one run, a ScalingSweep of it over these worker counts, e.g. 1,2")
    parser.add_argument("--max-epochs", type=int, help="override spec.training.maxEpochs (e.g. a short sweep)")
    args = parser.parse_args(argv)

    document = strict_yaml.load(Path(args.filename).read_text())
    if args.max_epochs:
        document["spec"].setdefault("training", {})["maxEpochs"] = args.max_epochs
    run = parse_scalingrun(document)
    state = Path(args.state).resolve()
    access_key, secret_key = _credentials(state)
    server = S3Server(state / "seaweedfs", access_key, secret_key)
    wanted_port = int(run.spec.storage.endpoint.rsplit(":", 1)[1]) if run.spec.storage.endpoint else None
    started = time.monotonic()
    server.start(preferred_s3_port=wanted_port)
    try:
        run.spec.storage.endpoint = server.endpoint  # the port may differ when 8333 is taken
        print(f"S3 server (SeaweedFS) on {server.endpoint}, data in {state / 'seaweedfs'}", file=sys.stderr)
        uploaded = upload_fashion_mnist(server, run.spec.dataset.source, args.per_class)
        print(f"dataset: {uploaded or 'already'} Fashion-MNIST JPEGs in {run.spec.dataset.source}", file=sys.stderr)
        os.environ.update(server.env())
        if args.sweep:
            return _sweep(run, args.sweep, state, started)
        local = LocalRun(run, state / "runs" / run.metadata.name, np_override=args.np)
        code = local.start(stop_after=args.stop_after)
        # The store stops below: what the run made is copied out first (scalingrun report -f reads the copy).
        kept = keep(progress_uri(run), local.workdir, server.filesystem())
    finally:
        server.stop()
    report = None
    if local.progress is not None and local.progress.history:
        from ..report.run import render_report

        report = render_report(local.progress, run.metadata.name, state / "reports")
    print_summary(local, run, state, report, time.monotonic() - started, kept)
    return code


if __name__ == "__main__":
    sys.exit(main())
