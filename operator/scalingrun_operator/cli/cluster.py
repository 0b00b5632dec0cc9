"""`scalingrun get` and `scalingrun wait`: a run's or sweep's status from the cluster, as kubectl reads it
(--kubeconfig, --context, -n; the context's namespace by default)."""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
import time
from typing import Any, Callable, Iterator, Optional

from scalingrun_api.models import GROUP, KIND, PLURAL, SWEEP_KIND, SWEEP_PLURAL, VERSION, duration_seconds
from scalingrun_api.models.common import DURATION_PATTERN
from ..decide import time_at_size
from ..decide.status import parse_time
from .loading import OK, USAGE, UserError, dump

TERMINAL = ("Succeeded", "Failed")
RUN_COLUMNS = ["NAME", "PHASE", "WORKERS", "EPOCH", "IMG/S", "INPUT-WAIT", "BEST-VAL-ACC", "ETA", "RESTARTS",
               "MESSAGE"]
SWEEP_COLUMNS = ["NAME", "PHASE", "POINTS", "RECOMMENDED", "MESSAGE"]
MESSAGE_WIDTH = 60


class Cluster:
    """The custom objects API and the namespace, from the kubeconfig (or the pod's service account)."""

    def __init__(self, args: argparse.Namespace):
        try:
            from kubernetes import client, config
        except ImportError:
            raise UserError("scalingrun: get and wait need the kubernetes package, which `pip install .` installs")
        try:
            api_client = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
            _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
            if args.context:
                active = next(c for c in config.list_kube_config_contexts(args.kubeconfig)[0]
                              if c["name"] == args.context)
            default_namespace = (active.get("context") or {}).get("namespace") or "default"
        except (config.ConfigException, OSError, StopIteration) as exc:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                raise UserError(f"scalingrun: no cluster to talk to: {exc} (set KUBECONFIG or --kubeconfig)") from None
            api_client, default_namespace = client.ApiClient(), "default"
        self.api_client = api_client
        self.api = client.CustomObjectsApi(api_client)
        self.namespace = args.namespace or default_namespace
        self.all_namespaces = getattr(args, "all_namespaces", False)

    def _call(self, call: Callable[..., Any], *arguments: Any, **options: Any) -> Any:
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*arguments, **options)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise UserError(f"scalingrun: the API server answered {exc.status} {exc.reason}") from None
        except HTTPError as exc:
            raise UserError(f"scalingrun: cannot reach the API server: {exc}") from None

    def get(self, plural: str, name: str) -> Optional[dict[str, Any]]:
        return self._call(self.api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name)

    def list(self, plural: str, name: Optional[str] = None) -> dict[str, Any]:
        selector = {"field_selector": f"metadata.name={name}"} if name else {}
        if self.all_namespaces:
            listed = self._call(self.api.list_cluster_custom_object, GROUP, VERSION, plural, **selector)
        else:
            listed = self._call(self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, plural,
                                **selector)
        if listed is None:  # the CRD is not installed
            raise UserError(f"scalingrun: {plural}.{GROUP} is not served by this cluster: install the chart "
                            "(or `scalingrun crd | kubectl apply --server-side -f -`)")
        return listed

    def watch(self, plural: str, name: Optional[str], version: str, seconds: int) -> Iterator[dict[str, Any]]:
        """The objects as they change after resourceVersion `version`, for at most `seconds`; ends early when the
        version has expired (410), so that the caller lists again."""
        from kubernetes import watch
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        selector = {"field_selector": f"metadata.name={name}"} if name else {}
        if self.all_namespaces:
            call, arguments = self.api.list_cluster_custom_object, (GROUP, VERSION, plural)
        else:
            call, arguments = self.api.list_namespaced_custom_object, (GROUP, VERSION, self.namespace, plural)
        try:
            for event in watch.Watch().stream(call, *arguments, resource_version=version,
                                              timeout_seconds=max(1, seconds), **selector):
                if event["type"] in ("ADDED", "MODIFIED"):
                    yield event["object"]
                elif event["type"] == "ERROR":
                    return
        except ApiException as exc:
            if exc.status == 410:
                return
            raise UserError(f"scalingrun: the API server answered {exc.status} {exc.reason}") from None
        except HTTPError as exc:
            raise UserError(f"scalingrun: cannot reach the API server: {exc}") from None


def _number(value: Any, form: str) -> str:
    return form.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _eta(training: dict[str, Any], now: dt.datetime) -> str:
    moment = training.get("estimatedCompletion")
    if not moment:
        return "-"
    try:
        left = dt.datetime.fromisoformat(str(moment).replace("Z", "+00:00")) - now
    except ValueError:
        return str(moment)
    minutes = max(0, int(left.total_seconds() // 60))
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def _message(status: dict[str, Any], wide: bool) -> str:
    message = " ".join(str(status.get("message") or "").split())
    return message if wide or len(message) <= MESSAGE_WIDTH else message[:MESSAGE_WIDTH - 1] + "…"


def _workers(spec: dict[str, Any], status: dict[str, Any], wide: bool, moment: dt.datetime) -> str:
    """spec.workers.replicas; an elastic run below it shows `now/most`, and wide output its resizes (each with its
    cost: seconds from the loss to training again), the last three, and the hours at each size (GPU-hours when the
    workers ask for GPUs, else worker-hours), the running size's counted to `moment` (a finished run's to its end)."""
    workers = spec.get("workers") or {}
    most = workers.get("replicas")
    elastic = time_at_size.read(status.get("training"))
    now = elastic.workers
    text = f"{now}/{most}" if now is not None and now != most else _number(most, "{}")
    resizes = [f"{r.from_}->{r.to} {_number(r.cost_seconds, '{}s')}" for r in elastic.resizes[-3:]]
    if elastic.resizing:
        resizes.append(f"{elastic.resizing.from_}->{elastic.resizing.to} now")
    gpus = workers.get("gpusPerWorker", 1)
    ended = status.get("phase") in TERMINAL and parse_time(status.get("completionTime"))
    sizes = time_at_size.time_at_sizes(elastic, gpus, ended or moment)
    hours = ", ".join(f"{s.workers}: {s.worker_hours if s.gpu_hours is None else s.gpu_hours:.2f}" for s in sizes)
    notes = ", ".join(resizes) + (f"; {'GPU' if gpus else 'worker'}-h {hours}" if hours else "")
    return f"{text} ({notes.lstrip('; ')})" if wide and notes else text


def run_row(run: dict[str, Any], now: dt.datetime, wide: bool = False) -> list[str]:
    status, spec = run.get("status") or {}, run.get("spec") or {}
    training = status.get("training") or {}
    epoch = training.get("epoch")
    epochs = f"{epoch}/{training['maxEpochs']}" if epoch and training.get("maxEpochs") else _number(epoch, "{}")
    best = (training.get("bestMetrics") or {}).get("val_accuracy")
    best_text = _number(best, "{:.4f}") + (f" @{training['bestEpoch']}" if best is not None and
                                           training.get("bestEpoch") else "")
    wait = training.get("inputWaitFraction")
    return [run["metadata"]["name"], status.get("phase") or "-", _workers(spec, status, wide, now), epochs,
            _number(training.get("imagesPerSecond"), "{:.0f}"), _number(wait, "{:.0%}"), best_text, _eta(training, now),
            _number(training.get("restarts") or 0, "{}"), _message(status, wide)]


def sweep_row(sweep: dict[str, Any], _: dt.datetime, wide: bool = False) -> list[str]:
    status = sweep.get("status") or {}
    recommended = (status.get("recommendation") or {}).get("run") or "-"
    return [sweep["metadata"]["name"], status.get("phase") or "-", status.get("progress") or "-", recommended,
            _message(status, wide)]


def table(rows: list[list[str]], columns: list[str]) -> str:
    widths = [max(len(row[i]) for row in [columns, *rows]) for i in range(len(columns))]
    return "\n".join("   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                     for row in [columns, *rows]) + "\n"


KINDS = {KIND: (PLURAL, run_row, RUN_COLUMNS), SWEEP_KIND: (SWEEP_PLURAL, sweep_row, SWEEP_COLUMNS)}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def cmd_get(args: argparse.Namespace) -> int:
    cluster = Cluster(args)
    kinds = [args.kind] if args.kind else list(KINDS)
    found = {kind: cluster.list(KINDS[kind][0], args.name) for kind in kinds}
    objects = [o for kind in kinds for o in found[kind].get("items") or []]
    where = "all namespaces" if cluster.all_namespaces else f"namespace {cluster.namespace}"
    if args.name and not objects:
        raise UserError(f"scalingrun get: {' or '.join(kinds)} {args.name} not found in {where}")
    if args.output in ("json", "yaml"):
        sys.stdout.write(dump(objects, args.output))
        return OK
    wide = args.output == "wide"
    shown = [kind for kind in kinds if found[kind].get("items")] or kinds[:1]
    for index, kind in enumerate(shown):
        _, row, columns = KINDS[kind]
        rows = [row(o, _now(), wide) for o in found[kind].get("items") or []]
        sys.stdout.write(("\n" if index else "") + table(rows, columns))
    if not objects:
        print(f"No ScalingRuns or ScalingSweeps found in {where}.", file=sys.stderr)
    sys.stdout.flush()
    if args.watch:
        _follow(cluster, shown[0], args.name, found[shown[0]]["metadata"].get("resourceVersion", "0"), wide)
    return OK


def _follow(cluster: Cluster, kind: str, name: Optional[str], version: str, wide: bool) -> None:
    """A row for every change, as `kubectl get -w` prints them, until interrupted."""
    plural, row, columns = KINDS[kind]
    last: dict[str, list[str]] = {}
    while True:
        for obj in cluster.watch(plural, name, version, 300):
            version = obj["metadata"].get("resourceVersion", version)
            cells = row(obj, _now(), wide)
            if last.get(obj["metadata"]["name"]) != cells:
                last[obj["metadata"]["name"]] = cells
                print(table([cells], columns).splitlines()[1], flush=True)
        version = cluster.list(plural, name)["metadata"].get("resourceVersion", "0")


def _reached(obj: dict[str, Any], wanted: str) -> bool:
    status = obj.get("status") or {}
    if wanted.startswith("condition="):
        kind, _, value = wanted[len("condition="):].partition("=")
        conditions = status.get("conditions") or []
        return any(c.get("type") == kind and c.get("status") == (value or "True") for c in conditions)
    return status.get("phase") == wanted


def _said(wanted: str) -> str:
    """Succeeded, or `Ready True` for condition=Ready."""
    if not wanted.startswith("condition="):
        return wanted
    kind, _, value = wanted[len("condition="):].partition("=")
    return f"{kind} {value or 'True'}"


def cmd_wait(args: argparse.Namespace) -> int:
    timeout = args.timeout
    if timeout and not (timeout.isdigit() or re.fullmatch(DURATION_PATTERN, timeout)):
        raise UserError(f"scalingrun wait: --timeout {args.timeout}: seconds or a duration such as 90s, 10m or "
                        "1h30m", USAGE)
    limit = duration_seconds(int(timeout) if timeout.isdigit() else timeout) if timeout else None
    cluster = Cluster(args)
    deadline = None if limit is None else time.monotonic() + limit
    # The kind named, else the one this name is (a run first).
    kind = args.kind or next((k for k in KINDS if cluster.list(KINDS[k][0], args.name).get("items")), KIND)
    plural = KINDS[kind][0]
    while True:  # list, judge, then watch until a change that may decide it (or the watch's end: list again)
        listed = cluster.list(plural, args.name)
        if not listed.get("items"):
            raise UserError(f"scalingrun wait: {kind} {args.name} not found in namespace {cluster.namespace}")
        obj, version = listed["items"][0], listed["metadata"].get("resourceVersion", "0")
        for obj in _changes(cluster, plural, args.name, version, obj, deadline):
            status = obj.get("status") or {}
            if _reached(obj, args.wanted):
                print(f"{kind.lower()}/{args.name} {_said(args.wanted)}")
                return OK
            if status.get("phase") in TERMINAL:
                raise UserError(f"scalingrun wait: {kind} {args.name} is {status['phase']}, it will not be "
                                f"{_said(args.wanted)}: {status.get('message') or ''}".rstrip(": "))
        if deadline is not None and time.monotonic() >= deadline:
            phase = (obj.get("status") or {}).get("phase") or "none yet"
            raise UserError(f"scalingrun wait: timed out after {args.timeout} waiting for {kind} {args.name} to be "
                            f"{_said(args.wanted)} (phase {phase})")


def _changes(cluster: Cluster, plural: str, name: str, version: str, first: dict[str, Any],
             deadline: Optional[float]) -> Iterator[dict[str, Any]]:
    """The object as listed, then as it changes, until the deadline or the watch's end."""
    yield first
    left = 300 if deadline is None else min(300, deadline - time.monotonic())
    if left > 0:
        yield from cluster.watch(plural, name, version, int(left) or 1)
