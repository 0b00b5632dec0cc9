"""`scalingrun`: the user's command line (no Kubernetes access needed for crd/validate/render)."""

from __future__ import annotations

import argparse
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
