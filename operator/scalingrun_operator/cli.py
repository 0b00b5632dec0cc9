"""`scalingrun`: the user's command line (no Kubernetes access needed for crd/validate/render)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import yaml

from .api.crd import render_crd_yaml, render_sweep_crd_yaml
from scalingrun_api.models import SWEEP_KIND
from .api.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep


def _parse(doc: Any):
    """A ScalingRun or a ScalingSweep, by its kind."""
    if isinstance(doc, dict) and doc.get("kind") == SWEEP_KIND:
        return parse_scalingsweep(doc)
    return parse_scalingrun(doc)


def _documents(path: str) -> Iterator[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for doc in yaml.safe_load_all(text):
        if doc is not None:
            yield doc


def _cmd_crd(_: argparse.Namespace) -> int:
    sys.stdout.write(render_crd_yaml() + "---\n" + render_sweep_crd_yaml())
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.filename:
        try:
            docs = list(_documents(path))
        except (OSError, yaml.YAMLError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            status = 1
            continue
        if not docs:
            print(f"{path}: no ScalingRun found", file=sys.stderr)
            status = 1
        for doc in docs:
            name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc, dict) else "?"
            kind = SWEEP_KIND if isinstance(doc, dict) and doc.get("kind") == SWEEP_KIND else "ScalingRun"
            try:
                _parse(doc)
            except InvalidScalingRun as exc:
                status = 1
                print(f"{path}: {kind} {name} is invalid:", file=sys.stderr)
                for error in exc.errors:
                    print(f"  {error}", file=sys.stderr)
            else:
                print(f"{path}: {kind} {name} is valid")
    return status


def _cmd_render(args: argparse.Namespace) -> int:
    from .api.sweep import build_point_run, sweep_points
    from .builders import build_children

    objects = []

    for doc in _documents(args.filename):
        try:
            run = _parse(doc)
        except InvalidScalingRun as exc:
            for error in exc.errors:
                print(f"{args.filename}: {error}", file=sys.stderr)
            return 1
        namespace = args.namespace or run.metadata.namespace or "default"
        if run.kind == SWEEP_KIND:  # its points; the operator adds the owner reference when it creates them
            objects.extend(build_point_run(run, point, namespace) for point in sweep_points(run))
        else:
            objects.extend(build_children(run, namespace=namespace))
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=100))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .local.runner import LocalRun, LocalRunError
    from .local.signals import Stopped, stop_on_signals

    if not args.local:
        print("scalingrun run: only --local is supported; in a cluster, kubectl apply -f the file", file=sys.stderr)
        return 2
    docs = list(_documents(args.filename))
    if len(docs) != 1:
        print(f"{args.filename}: expected one ScalingRun, found {len(docs)}", file=sys.stderr)
        return 2
    try:
        run = parse_scalingrun(docs[0])
    except InvalidScalingRun as exc:
        for error in exc.errors:
            print(f"{args.filename}: {error}", file=sys.stderr)
        return 1
    workdir = Path(args.workdir or Path(".scalingrun/runs") / run.metadata.name)
    try:
        with stop_on_signals():
            code = LocalRun(run, workdir, np_override=args.np, python_path=tuple(args.python_path or ())).start(
                stop_after=args.stop_after)
    except LocalRunError as exc:
        print(f"scalingrun run: {exc}", file=sys.stderr)
        return 2
    except Stopped as stopped:
        print(f"scalingrun run: stopped by {stopped.name}; the processes it started are stopped", file=sys.stderr)
        return stopped.exit_code
    print(f"status: {workdir / 'status.json'}", file=sys.stderr)
    return code


def _cmd_report(args: argparse.Namespace) -> int:
    from .builders.locations import progress_uri
    from .documents import read_progress
    from .report.run import render_report
    from .storage import StorageError, StorageTarget

    if args.filename and not args.progress:
        docs = list(_documents(args.filename))
        if docs and isinstance(docs[0], dict) and docs[0].get("kind") == SWEEP_KIND:
            return _sweep_report(args, parse_scalingsweep(docs[0]))
    if bool(args.filename) == bool(args.progress):
        print("scalingrun report: give either -f RUN.yaml or --progress PATH_OR_URI", file=sys.stderr)
        return 2
    if args.filename:
        run = parse_scalingrun(next(_documents(args.filename)))
        name, storage = run.metadata.name, run.spec.storage
        uri, target = progress_uri(run), StorageTarget(storage.endpoint, storage.region, None)
    else:
        # Keys (and an endpoint) from the environment, as for any S3 client.
        name, uri = args.name, args.progress
        target = StorageTarget(os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                               None)
    try:
        progress, _ = read_progress(uri, target)
    except StorageError as exc:
        print(f"scalingrun report: {exc}", file=sys.stderr)
        return 1
    if progress is None:
        print(f"scalingrun report: no progress document at {uri}", file=sys.stderr)
        return 1
    png, md = render_report(progress, name, Path(args.output))
    print(f"report: {png} and {md}")
    return 0


def _sweep_report(args: argparse.Namespace, sweep) -> int:
    """The sweep's report from its points' progress documents (keys from the environment)."""
    from .api.sweep import build_point_run, sweep_points
    from .builders.locations import progress_uri
    from .decide.progress import training_status
    from .decide.sweep import point_row, scaling
    from .documents import read_progress
    from .report.sweep import render_sweep_report, table_lines
    from .storage import Clients, StorageError, StorageTarget

    rows, clients = [], Clients()
    for point in sweep_points(sweep):
        run = parse_scalingrun(build_point_run(sweep, point))
        storage = run.spec.storage
        try:
            target = StorageTarget(storage.endpoint, storage.region, None, clients=clients)
            progress, _ = read_progress(progress_uri(run), target)
        except StorageError as exc:
            print(f"scalingrun report: {exc}", file=sys.stderr)
            return 1
        phase = "Succeeded" if (progress or {}).get("state") == "succeeded" else (progress or {}).get("state")
        rows.append(point_row(point, phase, training_status(progress), progress if phase == "Succeeded" else None))
    rows, recommendation = scaling(sweep, rows)
    try:
        png, md = render_sweep_report(rows, sweep.metadata.name, Path(args.output), recommendation,
                                      sweep.spec.efficiency_threshold)
    except ValueError as exc:
        print(f"scalingrun report: {exc}", file=sys.stderr)
        return 1
    print("\n".join(table_lines(rows)))
    print(f"report: {png} and {md}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .local.runner import LocalRunError
    from .local.signals import Stopped, stop_on_signals
    from .local.sweep import LocalSweep
    from .report.sweep import print_sweep

    if not args.local:
        print("scalingrun sweep: only --local is supported; in a cluster, kubectl apply -f the file", file=sys.stderr)
        return 2
    docs = list(_documents(args.filename))
    if len(docs) != 1:
        print(f"{args.filename}: expected one ScalingSweep, found {len(docs)}", file=sys.stderr)
        return 2
    try:
        sweep = parse_scalingsweep(docs[0])
    except InvalidScalingRun as exc:
        for error in exc.errors:
            print(f"{args.filename}: {error}", file=sys.stderr)
        return 1
    workdir = Path(args.workdir or Path(".scalingrun/sweeps") / sweep.metadata.name)
    local = LocalSweep(sweep, workdir, python_path=tuple(args.python_path or ()))
    try:
        with stop_on_signals():
            code = local.start()
    except LocalRunError as exc:
        print(f"scalingrun sweep: {exc}", file=sys.stderr)
        return 2
    except Stopped as stopped:
        print(f"scalingrun sweep: stopped by {stopped.name}; the processes it started are stopped", file=sys.stderr)
        return stopped.exit_code
    print_sweep(sweep.metadata.name, local.rows, local.recommendation, local.notes, sweep.spec.efficiency_threshold,
                Path(args.output or workdir))
    return code


def _cmd_operator(args: argparse.Namespace) -> int:
    from .main import run as run_operator  # imports kopf: only for this subcommand

    return run_operator(args.operator_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scalingrun", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("crd", help="print the ScalingRun CustomResourceDefinition").set_defaults(func=_cmd_crd)

    validate = sub.add_parser("validate", help="check ScalingRun files; name every bad field")
    validate.add_argument("-f", "--filename", action="append", required=True, help="file or - (repeatable)")
    validate.set_defaults(func=_cmd_validate)

    render = sub.add_parser("render", help="print every Kubernetes object the operator would create")
    render.add_argument("-f", "--filename", required=True, help="file or -")
    render.add_argument("-n", "--namespace", help="namespace (default: the object's, else default)")
    render.set_defaults(func=_cmd_render)

    run = sub.add_parser("run", help="run a ScalingRun on this machine (--local), without Kubernetes")
    run.add_argument("--local", action="store_true", required=True, help="preprocess, then horovodrun here")
    run.add_argument("-f", "--filename", required=True, help="file or -")
    run.add_argument("--np", type=int, help="Horovod processes (default: workers.replicas x slots)")
    run.add_argument("--workdir", help="where config and status go (default .scalingrun/runs/NAME)")
    run.add_argument("--stop-after", choices=["preprocessing", "training"], default="training")
    run.add_argument("--python-path", action="append", metavar="DIR",
                     help="a folder with your packages (model.builder, training.command), first on the processes' "
                          "PYTHONPATH as in your image (repeatable)")
    run.set_defaults(func=_cmd_run)

    sweep = sub.add_parser("sweep", help="run a ScalingSweep's points on this machine (--local), one after another")
    sweep.add_argument("--local", action="store_true", required=True, help="each point with horovodrun -np N here")
    sweep.add_argument("-f", "--filename", required=True, help="file or -")
    sweep.add_argument("--workdir", help="where the points' config and status go (default .scalingrun/sweeps/NAME)")
    sweep.add_argument("-o", "--output", help="folder for the report (default: the workdir)")
    sweep.add_argument("--python-path", action="append", metavar="DIR",
                       help="a folder with your packages, first on the points' PYTHONPATH (repeatable)")
    sweep.set_defaults(func=_cmd_sweep)

    report = sub.add_parser("report", help="draw a run's training curves, or a sweep's scaling, (PNG + Markdown) "
                            "from the progress documents")
    report.add_argument("-f", "--filename", help="the ScalingRun (or ScalingSweep); reads progress.json from its "
                        "run location (each point's)")
    report.add_argument("--progress", help="or a progress.json path or URI")
    report.add_argument("--name", default="run", help="run name for the titles (with --progress)")
    report.add_argument("-o", "--output", default=".", help="folder for the report files")
    report.set_defaults(func=_cmd_report)

    operator = sub.add_parser("operator", help="run the Kubernetes operator (same as scalingrun-operator)",
                              add_help=False)
    operator.add_argument("operator_args", nargs=argparse.REMAINDER, help="scalingrun-operator flags")
    operator.set_defaults(func=_cmd_operator)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["operator"]:  # its flags (and --help) belong to scalingrun-operator
        return _cmd_operator(argparse.Namespace(operator_args=argv[1:]))
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
