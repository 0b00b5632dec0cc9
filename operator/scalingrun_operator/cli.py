"""`scalingrun`: the user's command line (no Kubernetes access needed for crd/validate/render)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import yaml

from .api.crd import render_crd_yaml
from .api.validation import InvalidScalingRun, parse_scalingrun


def _documents(path: str) -> Iterator[Any]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for doc in yaml.safe_load_all(text):
        if doc is not None:
            yield doc


def _cmd_crd(_: argparse.Namespace) -> int:
    sys.stdout.write(render_crd_yaml())
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
            try:
                parse_scalingrun(doc)
            except InvalidScalingRun as exc:
                status = 1
                print(f"{path}: ScalingRun {name} is invalid:", file=sys.stderr)
                for error in exc.errors:
                    print(f"  {error}", file=sys.stderr)
            else:
                print(f"{path}: ScalingRun {name} is valid")
    return status


def _cmd_render(args: argparse.Namespace) -> int:
    from .builders import build_children

    objects = []
    for doc in _documents(args.filename):
        try:
            run = parse_scalingrun(doc)
        except InvalidScalingRun as exc:
            for error in exc.errors:
                print(f"{args.filename}: {error}", file=sys.stderr)
            return 1
        namespace = args.namespace or run.metadata.namespace or "default"
        objects.extend(build_children(run, namespace=namespace))
    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=100))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .local.runner import LocalRun, LocalRunError

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
        code = LocalRun(run, workdir, np_override=args.np).start(stop_after=args.stop_after)
    except LocalRunError as exc:
        print(f"scalingrun run: {exc}", file=sys.stderr)
        return 2
    print(f"status: {workdir / 'status.json'}", file=sys.stderr)
    return code


def _cmd_report(args: argparse.Namespace) -> int:
    from .handlers.training import progress_uri
    from .report import render_report
    from .storage import StorageError, StorageTarget, read_json

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
        progress = read_json(uri, target)
    except StorageError as exc:
        print(f"scalingrun report: {exc}", file=sys.stderr)
        return 1
    if progress is None:
        print(f"scalingrun report: no progress document at {uri}", file=sys.stderr)
        return 1
    png, md = render_report(progress, name, Path(args.output))
    print(f"report: {png} and {md}")
    return 0


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
    run.set_defaults(func=_cmd_run)

    report = sub.add_parser("report", help="draw a run's training curves (PNG + Markdown) from its progress")
    report.add_argument("-f", "--filename", help="the ScalingRun; reads progress.json from its run location")
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
