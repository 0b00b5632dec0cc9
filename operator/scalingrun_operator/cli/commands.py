"""The subcommands of `scalingrun`: each takes the parsed arguments and returns the exit code (0 ok, 1 failed or
invalid, 2 usage). A user's mistake raises loading.UserError, which main() prints as one line."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterator

import yaml

from scalingrun_api.models import KIND, SWEEP_KIND
from ..schema.crd import render_crd_yaml, render_sweep_crd_yaml
from ..schema.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep, spec_warnings, sweep_warnings
from .loading import (
    FAILED, OK, USAGE, Document, UserError, dump, files, is_ours, read, read_file, read_one, skipped_note,
)

# How long `report -f` waits on a store (one attempt, this timeout) before it draws from the copy a local run kept
# (a stopped quick start's store refuses connections, which are otherwise retried).
KEPT_STORE_DEADLINE_SECONDS = 5.0


def _parse(doc: Document, allow_host_path: bool = False):
    """A ScalingRun or a ScalingSweep, by its kind; `allow_host_path` as the operator's runs.allowHostPath."""
    if doc.kind == SWEEP_KIND:
        return parse_scalingsweep(doc.body, allow_host_path)
    return parse_scalingrun(doc.body, allow_host_path)


def invalid(doc: Document, exc: InvalidScalingRun) -> UserError:
    """The error that says `doc` is invalid, naming its source, kind and name, one line per validation error."""
    kind = doc.kind if doc.kind in (KIND, SWEEP_KIND) else KIND
    lines = [f"{doc.source}: {kind} {doc.name} is invalid:"] + [f"  {error}" for error in exc.errors]
    return UserError("\n".join(lines))


def _parsed(doc: Document):
    """`_parse`, its errors a UserError that names the document."""
    try:
        return _parse(doc)
    except InvalidScalingRun as exc:
        raise invalid(doc, exc) from None


def cmd_crd(args: argparse.Namespace) -> int:
    crds = [yaml.safe_load(render_crd_yaml()), yaml.safe_load(render_sweep_crd_yaml())]
    if args.output == "json":
        sys.stdout.write(dump(crds, "json"))
    else:  # as generated (and checked in), byte for byte
        sys.stdout.write(render_crd_yaml() + "---\n" + render_sweep_crd_yaml())
    return OK


def _readable(path: str) -> Iterator[Document | None]:
    """The documents of every file of one -f; None for a file that cannot be read (reported here)."""
    try:
        names = files(path)
    except UserError as exc:
        print(exc, file=sys.stderr)
        yield None
        return
    for name in names:
        try:
            yield from read_file(name)
        except UserError as exc:
            print(exc, file=sys.stderr)
            yield None


def cmd_validate(args: argparse.Namespace) -> int:
    """Every file is checked: a bad one does not stop the others."""
    status = OK
    for path in args.filename:
        ours = unreadable = 0
        for doc in _readable(path):
            if doc is None:
                unreadable += 1
            elif not is_ours(doc):
                print(skipped_note(doc), file=sys.stderr)
            else:
                ours += 1
                try:
                    resource = _parse(doc, args.allow_host_path)
                except InvalidScalingRun as exc:
                    status = FAILED
                    print(invalid(doc, exc), file=sys.stderr)
                else:
                    print(f"{doc.source}: {doc.kind} {doc.name} is valid")
                    warnings = sweep_warnings(resource) if doc.kind == SWEEP_KIND else spec_warnings(resource)
                    for warning in warnings:  # valid all the same: the exit code stays 0
                        print(f"{doc.source}: {doc.kind} {doc.name}: warning: {warning}", file=sys.stderr)
        if unreadable:
            status = FAILED
        elif not ours:  # an unreadable file has said why already
            print(f"{path}: no {KIND} or {SWEEP_KIND} found", file=sys.stderr)
            status = FAILED
    return status


def cmd_render(args: argparse.Namespace) -> int:
    from ..schema.sweep import build_point_run, sweep_points
    from ..builders import build_children

    objects = []
    for doc in read(args.filename):
        resource = _parsed(doc)
        namespace = args.namespace or resource.metadata.namespace or "default"
        if resource.kind == SWEEP_KIND:  # its points; the operator adds the owner reference when it creates them
            objects.extend(build_point_run(resource, point, namespace) for point in sweep_points(resource))
        else:
            objects.extend(build_children(resource, namespace=namespace))
    sys.stdout.write(dump(objects, args.output))
    return OK


def _python_path(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.python_path or ())


def _local_only(args: argparse.Namespace, command: str) -> None:
    if not args.local:
        raise UserError(f"scalingrun {command}: only --local is supported (on this machine); in a cluster, "
                        f"kubectl apply -f {args.filename}", USAGE)


def _locally(command: str, start: Callable[[], int]) -> tuple[int, bool]:
    """(start()'s exit code, False), with SIGTERM, SIGINT and SIGHUP stopping every process it started: then (the
    signal's exit code, True). A LocalRunError is the user's (a usage error)."""
    from ..local.runner import LocalRunError
    from ..local.signals import Stopped, stop_on_signals

    try:
        with stop_on_signals():
            return start(), False
    except LocalRunError as exc:
        raise UserError(f"scalingrun {command}: {exc}", USAGE) from None
    except Stopped as stopped:
        print(f"scalingrun {command}: stopped by {stopped.name}; the processes it started are stopped",
              file=sys.stderr)
        return stopped.exit_code, True


def cmd_run(args: argparse.Namespace) -> int:
    from ..local.runner import LocalRun

    _local_only(args, "run")
    run = _parsed(read_one([args.filename], (KIND,), "run"))
    workdir = Path(args.workdir or Path(".scalingrun/runs") / run.metadata.name)
    code, stopped = _locally("run", lambda: LocalRun(run, workdir, np_override=args.np,
                                                     python_path=_python_path(args)).start(stop_after=args.stop_after))
    if stopped:
        return code
    print(f"status: {workdir / 'status.json'}", file=sys.stderr)
    return code


def cmd_sweep(args: argparse.Namespace) -> int:
    from ..local.sweep import LocalSweep
    from ..report.sweep import print_sweep

    _local_only(args, "sweep")
    sweep = _parsed(read_one([args.filename], (SWEEP_KIND,), "sweep"))
    workdir = Path(args.workdir or Path(".scalingrun/sweeps") / sweep.metadata.name)
    local = LocalSweep(sweep, workdir, python_path=_python_path(args))
    code, stopped = _locally("sweep", local.start)
    if stopped:
        return code
    print_sweep(sweep.metadata.name, local.rows, local.recommendation, local.notes, sweep.spec.efficiency_threshold,
                Path(args.output or workdir))
    return code


def cmd_report(args: argparse.Namespace) -> int:
    from ..builders.locations import progress_uri
    from ..documents import parse_progress
    from ..local.keep import kept_progress
    from ..report.run import render_report, workers_over_time
    from ..object_store import StorageError, Store, read_json

    if bool(args.filename) == bool(args.progress):
        raise UserError("scalingrun report: give either -f RUN.yaml or --progress PATH_OR_URI", USAGE)
    if args.filename:
        doc = read_one([args.filename], (KIND, SWEEP_KIND), "report")
        resource = _parsed(doc)
        if resource.kind == SWEEP_KIND:
            return _sweep_report(args, resource)
        name, storage = resource.metadata.name, resource.spec.storage
        # A run as read from the cluster (kubectl get -o yaml) has its status: an elastic run's sizes over time.
        workers = workers_over_time(doc.body.get("status"), resource.spec.workers.gpus_per_worker,
                                    dt.datetime.now(dt.timezone.utc))
        uri, store = progress_uri(resource), Store(storage.endpoint, storage.region)
        kept = kept_progress(name, workdir=Path(args.workdir) if args.workdir else None)
        if kept is not None:  # a stopped store (the quick start's) is not waited for long: there is a copy
            store = dataclasses.replace(store, timeout=KEPT_STORE_DEADLINE_SECONDS, attempts=1)
    else:
        # Keys (and an endpoint) from the environment, as for any S3 client.
        name, uri = args.name, args.progress
        store = Store(os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
        kept, workers = None, None
    try:
        progress = parse_progress(read_json(uri, store))
        missing = f"no progress document at {uri}"
    except StorageError as exc:
        progress, missing = None, str(exc)
    if progress is None:
        if kept is None:
            raise UserError(f"scalingrun report: {missing}")
        print(f"scalingrun report: {missing}; drawing from {kept}, which the local run kept", file=sys.stderr)
        progress = parse_progress(json.loads(kept.read_text()))
    png, md = render_report(progress, name, Path(args.output), workers)
    print(f"report: {png} and {md}")
    return OK


def _sweep_report(args: argparse.Namespace, sweep) -> int:
    """The sweep's report from its points' progress documents (keys from the environment)."""
    from ..report.sweep import render_sweep_report, rows_from_storage, table_lines
    from ..object_store import StorageError

    try:
        rows, recommendation = rows_from_storage(sweep)
        png, md = render_sweep_report(rows, sweep.metadata.name, Path(args.output), recommendation,
                                      sweep.spec.efficiency_threshold)
    except (StorageError, ValueError) as exc:
        raise UserError(f"scalingrun report: {exc}") from None
    print("\n".join(table_lines(rows)))
    print(f"report: {png} and {md}")
    return OK


def cmd_operator(args: argparse.Namespace) -> int:
    from ..main import run as run_operator  # imports kopf: only for this subcommand

    return run_operator(args.operator_args)
