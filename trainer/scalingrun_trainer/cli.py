"""`scalingrun-trainer`: what the preprocessing Job and the MPIJob containers run (preprocess or, for a Parquet
table, inspect; train; launch; logged, which archives a command's log).

Human progress goes to stderr; the last stdout line is a JSON summary for the operator.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Mapping, Optional

from scalingrun_api.manifest import TERMINATION_MESSAGE_BYTES
from .launch.mpirun import DEFAULT_HOSTFILE, DEFAULT_SSH_PORT, DEFAULT_TIMEOUT_SECONDS, launch

TERMINATION_LOG = "/dev/termination-log"
# The preprocessing's plan id (the Job's uid in the cluster): shard 0 plans, the others wait for that plan.
PLAN_ID_VARIABLE = "SCALINGRUN_PLAN_ID"
# The operator's Job sets both from its pods' labels (the Job's uid under the 1.27+ name and the legacy one); a label
# the server does not set arrives empty.
PLAN_ID_VARIABLES = (PLAN_ID_VARIABLE, "SCALINGRUN_PLAN_ID_LEGACY")


def plan_id_from(given: Optional[str], environ: Mapping[str, str]) -> Optional[str]:
    """The preprocessing's plan id: --plan-id, else the first of PLAN_ID_VARIABLES set and not empty, else None."""
    return given or next((environ[name] for name in PLAN_ID_VARIABLES if environ.get(name)), None)


def _preprocess_params(args: argparse.Namespace):
    """The dataset spec of --config (defaults: the spec's, scalingrun_api.models.Dataset), each flag given winning."""
    from pydantic import ValidationError

    from scalingrun_api.models import Dataset, Storage
    from .core.config import parse_config, read_document
    from .preprocess.source import Params

    document = read_document(args.config)
    flags = {"source": args.source, "output": args.output, "image_size": args.image_size,
             "validation_fraction": args.validation_fraction, "sample_fraction": args.sample_fraction,
             "seed": args.seed}
    flags = {name: value for name, value in flags.items() if value is not None}
    try:
        if document:
            config = parse_config(document)
            dataset = config.dataset.model_copy(update=flags)
            storage, processes = config.storage, config.processes
        else:
            if not (args.source and args.output):
                raise SystemExit("scalingrun-trainer preprocess: --source and --output (or --config) are required")
            dataset, storage, processes = Dataset(**flags), Storage(), 1
    except ValidationError as exc:
        raise SystemExit(f"scalingrun-trainer preprocess: {exc}") from None
    preprocessing = dataset.preprocessing
    return Params(
        source=dataset.source,
        output=dataset.output,
        image_size=dataset.image_size,
        validation_fraction=dataset.validation_fraction,
        sample_fraction=dataset.sample_fraction,
        seed=dataset.seed,
        max_bad_fraction=preprocessing.max_bad_fraction if args.max_bad_fraction is None else args.max_bad_fraction,
        # A sweep lays one dataset out for its largest point (dataset.preprocessing.readers).
        max_readers=args.max_readers or max(processes, preprocessing.readers or 0),
        endpoint=args.endpoint or storage.endpoint,
        region=args.region or storage.region,
    )


def _cmd_preprocess(args: argparse.Namespace) -> int:
    from .preprocess.shards import PreprocessError, process_shard
    from .preprocess.plan import obtain_plan
    from .storage import open_location

    params = _preprocess_params(args)
    plan_id = plan_id_from(args.plan_id, os.environ)
    plan = None
    if args.all_shards:
        if args.shard_index is not None:
            raise SystemExit("scalingrun-trainer preprocess: --all-shards and --shard-index exclude each other")
        # A Job without completion indexes (Kubernetes < 1.22): this one process plans once, then does every
        # shard, in order; shards already done are skipped, so a retried pod continues where the last one stopped.
        indexes = list(range(args.shard_count))
    else:
        index = args.shard_index
        indexes = [int(os.environ.get("JOB_COMPLETION_INDEX", "0")) if index is None else index]
    for index in indexes:
        try:
            if args.all_shards and plan is None:
                plan = obtain_plan(params, open_location(params.source, params.endpoint, params.region),
                                   open_location(params.output, params.endpoint, params.region), 0,
                                   args.shard_count, plan_id)
            summary = process_shard(params, index, args.shard_count, workers=args.workers, plan_id=plan_id,
                                    plan=plan, **({"fetch_ahead": args.fetch_ahead} if args.fetch_ahead else {}))
        except PreprocessError as exc:
            print(f"preprocess failed: {exc}", file=sys.stderr)
            print(json.dumps({"event": "preprocess", "shard": index, "error": str(exc)}))
            return exc.exit_code
        print(json.dumps(summary))
    _leave_manifest(params, summary["fingerprint"])
    return 0


def _leave_manifest(params, fingerprint: str) -> None:
    """The dataset's manifest, once the shards made it (an earlier dataset's is not this one), in this pod's
    termination message: where the operator reads it (it reads no storage when its status endpoint is on)."""
    from scalingrun_api.manifest import MANIFEST_FILE, DatasetManifest, manifest_termination_message
    from .preprocess.plan import read_json
    from .storage import open_location

    manifest = DatasetManifest.read(read_json(open_location(params.output, params.endpoint, params.region)
                                              .join(MANIFEST_FILE)))
    if manifest is not None and manifest.fingerprint == fingerprint:
        _termination_message(manifest_termination_message(manifest))


def _table_params(args: argparse.Namespace):
    """The Parquet table of --config (dataset.format parquet), each flag given winning."""
    from pydantic import ValidationError

    from .core.config import parse_config, read_document
    from .preprocess.parquet_table import TableParams

    document = read_document(args.config)
    values = {}
    if document:
        try:
            config = parse_config(document)
        except ValidationError as exc:
            raise SystemExit(f"scalingrun-trainer inspect: {exc}") from None
        dataset, storage = config.dataset, config.storage
        values = {"source": dataset.source, "output": dataset.output, "image_size": dataset.image_size,
                  "image_column": dataset.columns.image, "label_column": dataset.columns.label,
                  "readers": max(config.processes, dataset.preprocessing.readers or 0),
                  "endpoint": storage.endpoint, "region": storage.region}
    flags = {"source": args.source, "output": args.output, "image_size": args.image_size,
             "image_column": args.image_column, "label_column": args.label_column, "readers": args.max_readers,
             "endpoint": args.endpoint, "region": args.region}
    values.update({name: value for name, value in flags.items() if value is not None})
    if not (values.get("source") and values.get("output")):
        raise SystemExit("scalingrun-trainer inspect: --source and --output (or --config) are required")
    return TableParams(**values)


def _cmd_inspect(args: argparse.Namespace) -> int:
    """dataset.format parquet: check the table and write the dataset manifest (in the preprocessing Job's place)."""
    from scalingrun_api.manifest import manifest_termination_message
    from .preprocess.parquet_table import forget_manifest, inspect_table, summary, write_manifest
    from .preprocess.source import PreprocessError

    params = _table_params(args)
    try:
        manifest = inspect_table(params)
        write_manifest(params, manifest)
    except (PreprocessError, OSError) as exc:
        message = str(exc) if isinstance(exc, PreprocessError) else f"{type(exc).__name__}: {exc}"
        print(f"inspect failed: {message}", file=sys.stderr)
        if isinstance(exc, PreprocessError):
            forget_manifest(params)
        _termination_message(message)
        print(json.dumps({"event": "inspect", "error": message}))
        return getattr(exc, "exit_code", 1)
    _termination_message(manifest_termination_message(manifest))
    for warning in manifest.warnings or []:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"inspect: {params.source}: {manifest.written['train']} train / {manifest.written['validation']} "
          f"validation rows, {len(manifest.classes)} classes, row groups {manifest.row_groups}; manifest in "
          f"{params.output}", file=sys.stderr)
    print(json.dumps(summary(manifest)))
    return 0


def _termination_message(message: str) -> None:
    """Kubernetes shows a container's /dev/termination-log in its terminated state: the operator quotes it (a
    failure) or reads the dataset's manifest from it. The kubelet makes the file; where there is none (a local run,
    even as root) nothing is written."""
    if not os.path.isfile(TERMINATION_LOG):
        return
    try:
        with open(TERMINATION_LOG, "w") as f:
            f.write(message[:TERMINATION_MESSAGE_BYTES])
    except OSError:
        pass  # not in a pod


def _cmd_train(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from scalingrun_api.engines import ENGINES
    from .core.config import engine_of, parse_config, read_document

    document = read_document(args.config)
    try:
        framework, strategy = engine_of(document)
    except ValidationError as exc:
        print(f"scalingrun-trainer train: error: {exc}", file=sys.stderr)
        return 2
    if (framework, strategy) not in ENGINES:
        print(f"scalingrun-trainer train: error: training.strategy {strategy} is not one of training.framework "
              f"{framework}'s", file=sys.stderr)
        return 2
    # An image holds one framework's stack (torch only in the Lightning one, TensorFlow only in the Keras one,
    # Horovod only where the horovod strategy runs), so importing the engine's stack says which image to use.
    row = ENGINES[framework, strategy]
    try:
        for module in row.stack:
            importlib.import_module(module)
        engine = importlib.import_module(row.trainer_module)
    except ImportError as exc:
        print(f"scalingrun-trainer train: error: training.framework {framework} needs {exc.name}, which this "
              f"environment lacks: use {row.image_words} (spec.workers.image) or its venv", file=sys.stderr)
        return 2
    try:
        config = parse_config(document)
    except ValidationError as exc:
        print(f"scalingrun-trainer train: error: the config is not a valid ScalingRun's: {exc}", file=sys.stderr)
        return 2
    return engine.train(config)


def _cmd_launch(args: argparse.Namespace) -> int:
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    return launch(command, hostfile=args.hostfile, port=args.ssh_port, timeout=args.timeout, logs=args.logs)


def _cmd_logged(args: argparse.Namespace) -> int:
    from .launch.run_logs import PodArchive, run_archived

    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        print("scalingrun-trainer logged: error: no command to run (usage: logged --logs URI -- COMMAND ...)",
              file=sys.stderr)
        return 2
    return run_archived(command, PodArchive(args.logs))


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
    pre.add_argument("--max-readers", type=int, help="training processes that will read it (row groups >= 2x)")
    pre.add_argument("--shard-index", type=int, help="default: $JOB_COMPLETION_INDEX, else 0")
    pre.add_argument("--shard-count", type=int, default=1)
    pre.add_argument("--all-shards", action="store_true",
                     help="process every shard in turn (for Jobs without a completion index)")
    pre.add_argument("--workers", type=int, help="decoding processes (default: one per core)")
    pre.add_argument("--fetch-ahead", type=int,
                     help="objects each decoding process downloads at once (default: decoding.FETCH_AHEAD, 8; 1: one "
                     "at a time, as before)")
    pre.add_argument("--plan-id", help=f"shard 0 lists the source and writes the plan, the other shards wait for "
                     f"the plan of this id (default: ${PLAN_ID_VARIABLE}, else ${PLAN_ID_VARIABLES[1]}); "
                     "without one every call plans for itself")
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

    tr = sub.add_parser("train", help="training by the engine of training.framework and training.strategy: Keras + "
                                       "Horovod (horovodrun or mpirun, a process per GPU), Keras + "
                                       "MultiWorkerMirroredStrategy (mpirun, a process per worker), or PyTorch "
                                       "Lightning DDP (mpirun, a process per GPU)")
    tr.add_argument("--config", required=True, help="trainer config rendered by the operator (JSON file or -)")
    tr.set_defaults(func=_cmd_train)

    la = sub.add_parser("launch", help="MPIJob launcher: wait until every worker in the hostfile answers ssh, "
                                       "then run the command (mpirun ...)")
    la.add_argument("--hostfile", default=DEFAULT_HOSTFILE, help=f"default: {DEFAULT_HOSTFILE}")
    la.add_argument("--ssh-port", type=int, default=DEFAULT_SSH_PORT, help=f"default: {DEFAULT_SSH_PORT}")
    la.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                    help=f"seconds to wait for all workers (default: {DEFAULT_TIMEOUT_SECONDS:.0f})")
    la.add_argument("--logs", metavar="URI", help="archive the command's log under URI/attempt-<n>/ when it ends "
                    "(and every minute); the operator passes <runLocation>/logs. Without it the command is exec'd")
    la.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    la.set_defaults(func=_cmd_launch)

    lo = sub.add_parser("logged", help="run the command with its log archived in URI/<pod>.log when it ends (and "
                                       "every minute): the preprocessing pods' command")
    lo.add_argument("--logs", required=True, metavar="URI", help="the run's <runLocation>/logs/preprocess")
    lo.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    lo.set_defaults(func=_cmd_logged)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
