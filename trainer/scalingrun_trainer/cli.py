"""`scalingrun-trainer`: what the preprocessing Job and the MPIJob containers run (preprocess or, for a Parquet
table, inspect; train; launch).

Human progress goes to stderr; the last stdout line is a JSON summary for the operator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

from .launcher import DEFAULT_HOSTFILE, DEFAULT_SSH_PORT, DEFAULT_TIMEOUT_SECONDS, launch

TERMINATION_LOG = "/dev/termination-log"


def _load_config(path: Optional[str]) -> dict[str, Any]:
    if not path:
        return {}
    with (sys.stdin if path == "-" else open(path)) as f:
        return json.load(f)


def _preprocess_params(args: argparse.Namespace):
    from .preprocess import Params

    config = _load_config(args.config)
    dataset = config.get("dataset", {})
    storage = config.get("storage", {})

    def pick(flag, *keys, default=None):
        if flag is not None:
            return flag
        node: Any = dataset
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return default if node is None else node

    source, output = pick(args.source, "source"), pick(args.output, "output")
    if not source or not output:
        raise SystemExit("scalingrun-trainer preprocess: --source and --output (or --config) are required")
    return Params(
        source=source,
        output=output,
        image_size=pick(args.image_size, "imageSize", default=299),
        validation_fraction=pick(args.validation_fraction, "validationFraction", default=0.1),
        sample_fraction=pick(args.sample_fraction, "sampleFraction", default=1.0),
        seed=pick(args.seed, "seed", default=42),
        max_bad_fraction=pick(args.max_bad_fraction, "preprocessing", "maxBadFraction", default=0.05),
        # A sweep lays one dataset out for its largest point (dataset.preprocessing.readers).
        max_readers=args.max_readers or max(config.get("processes") or 1,
                                            pick(None, "preprocessing", "readers", default=0)),
        endpoint=args.endpoint or storage.get("endpoint"),
        region=args.region or storage.get("region"),
    )


def _cmd_preprocess(args: argparse.Namespace) -> int:
    from .preprocess import PreprocessError, process_shard

    params = _preprocess_params(args)
    if args.all_shards:
        if args.shard_index is not None:
            raise SystemExit("scalingrun-trainer preprocess: --all-shards and --shard-index exclude each other")
        # A Job without completion indexes (Kubernetes < 1.22): this one process does every shard, in order;
        # shards already done are skipped, so a retried pod continues where the last one stopped.
        indexes = list(range(args.shard_count))
    else:
        index = args.shard_index
        indexes = [int(os.environ.get("JOB_COMPLETION_INDEX", "0")) if index is None else index]
    for index in indexes:
        try:
            summary = process_shard(params, index, args.shard_count, workers=args.workers)
        except PreprocessError as exc:
            print(f"preprocess failed: {exc}", file=sys.stderr)
            print(json.dumps({"event": "preprocess", "shard": index, "error": str(exc)}))
            return exc.exit_code
        print(json.dumps(summary))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    """dataset.format parquet: check the table and write the dataset manifest (in the preprocessing Job's place)."""
    from .parquet_table import TableParams, forget_manifest, inspect_table, summary, write_manifest
    from .preprocess import PreprocessError

    config = _load_config(args.config)
    dataset, storage = config.get("dataset") or {}, config.get("storage") or {}
    columns = dataset.get("columns") or {}
    params = TableParams(
        source=args.source or dataset.get("source"), output=args.output or dataset.get("output"),
        image_size=args.image_size or dataset.get("imageSize", 299),
        image_column=args.image_column or columns.get("image", "image"),
        label_column=args.label_column or columns.get("label", "label"),
        readers=args.max_readers or max(config.get("processes") or 1, (dataset.get("preprocessing") or {}).get(
            "readers") or 0),
        endpoint=args.endpoint or storage.get("endpoint"), region=args.region or storage.get("region"))
    if not params.source or not params.output:
        raise SystemExit("scalingrun-trainer inspect: --source and --output (or --config) are required")
    try:
        manifest = inspect_table(params)
        write_manifest(params, manifest)
    except (PreprocessError, OSError) as exc:
        message = f"{type(exc).__name__}: {exc}" if not isinstance(exc, PreprocessError) else str(exc)
        print(f"inspect failed: {message}", file=sys.stderr)
        if isinstance(exc, PreprocessError):
            forget_manifest(params)
        _termination_message(message)
        print(json.dumps({"event": "inspect", "error": message}))
        return getattr(exc, "exit_code", 1)
    for warning in manifest["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"inspect: {params.source}: {manifest['written']['train']} train / {manifest['written']['validation']} "
          f"validation rows, {len(manifest['classes'])} classes, row groups {manifest['rowGroups']}; manifest in "
          f"{params.output}", file=sys.stderr)
    print(json.dumps(summary(manifest)))
    return 0


def _termination_message(message: str) -> None:
    """Kubernetes shows a container's /dev/termination-log in its terminated state: the operator quotes it."""
    try:
        with open(TERMINATION_LOG, "w") as f:
            f.write(message[:4000])
    except OSError:
        pass  # not in a pod


def _cmd_train(args: argparse.Namespace) -> int:
    config = _load_config(args.config)
    framework = (config.get("training") or {}).get("framework") or "keras"
    # Each image holds one framework's stack (torch only in the Lightning one, TensorFlow + Horovod only in the
    # Keras one): the other's import fails, and says which image to use.
    try:
        if framework == "pytorch-lightning":
            import pytorch_lightning  # noqa: F401
            import torch  # noqa: F401

            from .lightning.train import train
        else:
            import horovod.tensorflow.keras  # noqa: F401

            from .train import train
    except ImportError as exc:
        image = "the Lightning trainer image (-lightning-cpu)" if framework == "pytorch-lightning" else \
            "the Keras trainer image"
        print(f"scalingrun-trainer train: error: training.framework {framework} needs {exc.name}, which this "
              f"environment lacks: use {image} (spec.workers.image) or its venv", file=sys.stderr)
        return 2
    return train(config)


def _cmd_launch(args: argparse.Namespace) -> int:
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    return launch(command, hostfile=args.hostfile, port=args.ssh_port, timeout=args.timeout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalingrun-trainer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    pre = sub.add_parser("preprocess",
                         help="JPEG tree -> labelled Parquet shards (one shard per call, or --all-shards)")
    pre.add_argument("--config", help="trainer config rendered by the operator (JSON file or -)")
    pre.add_argument("--source", help="s3://bucket/prefix or a local folder: SOURCE/<class>/<image>")
    pre.add_argument("--output", help="where train/ and validation/ Parquet go")
    pre.add_argument("--image-size", type=int)
    pre.add_argument("--validation-fraction", type=float)
    pre.add_argument("--sample-fraction", type=float)
    pre.add_argument("--seed", type=int)
    pre.add_argument("--max-bad-fraction", type=float)
    pre.add_argument("--max-readers", type=int, help="Horovod processes that will read it (row groups >= 2x)")
    pre.add_argument("--shard-index", type=int, help="default: $JOB_COMPLETION_INDEX, else 0")
    pre.add_argument("--shard-count", type=int, default=1)
    pre.add_argument("--all-shards", action="store_true",
                     help="process every shard in turn (for Jobs without a completion index)")
    pre.add_argument("--workers", type=int, help="decoding processes (default: one per core)")
    pre.add_argument("--endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL)")
    pre.add_argument("--region")
    pre.set_defaults(func=_cmd_preprocess)

    ins = sub.add_parser("inspect", help="dataset.format parquet: check a Parquet table (columns, types, image "
                                         "shape, row groups) and write the dataset manifest for the trainers")
    ins.add_argument("--config", help="trainer config rendered by the operator (JSON file or -)")
    ins.add_argument("--source", help="the table: SOURCE/train/*.parquet and SOURCE/validation/*.parquet")
    ins.add_argument("--output", help="where the dataset manifest goes (spec.dataset.output)")
    ins.add_argument("--image-size", type=int)
    ins.add_argument("--image-column")
    ins.add_argument("--label-column")
    ins.add_argument("--max-readers", type=int, help="processes that will read it (row groups >= 2x)")
    ins.add_argument("--endpoint", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL)")
    ins.add_argument("--region")
    ins.set_defaults(func=_cmd_inspect)

    tr = sub.add_parser("train", help="training, one process per GPU: Keras + Horovod (horovodrun or mpirun), or "
                                       "PyTorch Lightning DDP (mpirun) when training.framework is pytorch-lightning")
    tr.add_argument("--config", required=True, help="trainer config rendered by the operator (JSON file or -)")
    tr.set_defaults(func=_cmd_train)

    la = sub.add_parser("launch", help="MPIJob launcher: wait until every worker in the hostfile answers ssh, "
                                       "then exec the command (mpirun ...)")
    la.add_argument("--hostfile", default=DEFAULT_HOSTFILE, help=f"default: {DEFAULT_HOSTFILE}")
    la.add_argument("--ssh-port", type=int, default=DEFAULT_SSH_PORT, help=f"default: {DEFAULT_SSH_PORT}")
    la.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                    help=f"seconds to wait for all workers (default: {DEFAULT_TIMEOUT_SECONDS:.0f})")
    la.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    la.set_defaults(func=_cmd_launch)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
