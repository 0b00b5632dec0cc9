"""`scalingrun logs RUN`: the launcher's log (mpirun's output, every rank's lines), one rank's lines, or the
preprocessing pods' logs. From the live pod while it exists (-f follows it), else from the archive the launcher
(or the preprocessing pod) wrote in the run's storage at the end of each attempt (status.logs, named in scalingrun_api.logs), read with the
run's storage settings and the keys of its credentials Secret (or, when that may not be read, the environment's)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterator, Optional

from scalingrun_api.logs import (
    ATTEMPT_RECORD, LAUNCHER_LOG, PREPROCESS_FOLDER, AttemptRecord, RankLines, attempt_folder, attempt_number, rank_log,
)
from scalingrun_api.models import PLURAL
from ..builders.common import RUN_LABEL, mpijob_name
from ..decide.pod_facts import LAUNCHER, PREPROCESS, pod_role
from .cluster import Cluster
from .loading import OK, USAGE, UserError

MAX_LOG_BYTES = 4 * 1024 * 1024  # an archived file is at most ~1 MiB (scalingrun_api.logs): room to spare
INTERRUPTED = 130


def cmd_logs(args: argparse.Namespace) -> int:
    if args.rank is not None and args.rank < 0:
        raise UserError(f"scalingrun logs: --rank {args.rank}: a rank is 0 or more", USAGE)
    if args.attempt is not None and args.attempt < 1:
        raise UserError(f"scalingrun logs: --attempt {args.attempt}: attempts count from 1", USAGE)
    cluster = Cluster(args)
    run = cluster.get(PLURAL, args.name)
    if run is None:
        raise UserError(f"scalingrun logs: ScalingRun {args.name} not found in namespace {cluster.namespace}")
    logs = RunLogs(cluster, run, args.endpoint)
    try:
        if args.preprocess:
            return logs.preprocessing(args.follow)
        if args.attempt is None:
            pod = logs.live_pod(LAUNCHER)
            if pod is not None and logs.print_pod(pod, args.rank, args.follow):
                return OK
        return logs.archived(args.attempt, args.rank, args.follow)
    except KeyboardInterrupt:  # -f ends with ^C, as kubectl logs -f does
        return INTERRUPTED


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Whole lines (the last one possibly without a newline) from a stream of chunks."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            yield line + b"\n"
    if pending:
        yield pending


def of_rank(lines: Iterator[bytes], rank: Optional[int]) -> Iterator[bytes]:
    """The launcher's lines, or only rank `rank`'s, joined from Open MPI's tagged pieces without their tags."""
    if rank is None:
        yield from lines
        return
    pieces = RankLines()
    for line in lines:
        yield from (text for number, text in pieces.feed(line) if number == rank)


def _write(lines: Iterator[bytes]) -> None:
    out = sys.stdout.buffer
    for line in lines:
        out.write(line)
        out.flush()


def _note(text: str) -> None:
    print(f"scalingrun logs: {text}", file=sys.stderr, flush=True)


class RunLogs:
    """One run's logs: its pods through the API server, its archive through its store."""

    def __init__(self, cluster: Cluster, run: dict[str, Any], endpoint: Optional[str]):
        from kubernetes import client

        self.cluster, self.run, self.endpoint = cluster, run, endpoint
        self.name, self.namespace = run["metadata"]["name"], cluster.namespace
        self.core = client.CoreV1Api(cluster.api_client)
        self._model = None

    def _api(self, call, *arguments: Any, **options: Any) -> Any:
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*arguments, **options)
        except ApiException as exc:
            raise UserError(f"scalingrun logs: the API server answered {exc.status} {exc.reason}") from None
        except HTTPError as exc:
            raise UserError(f"scalingrun logs: cannot reach the API server: {exc}") from None

    def pods(self, role: str) -> list[dict[str, Any]]:
        """The run's pods of `role`, oldest first."""
        listed = self._api(self.core.list_namespaced_pod, self.namespace, label_selector=f"{RUN_LABEL}={self.name}",
                           _preload_content=False)
        pods = json.loads(listed.data).get("items") or []
        mine = [p for p in pods if pod_role(p, mpijob_name(self._parsed())) == role]
        return sorted(mine, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))

    def live_pod(self, role: str) -> Optional[dict[str, Any]]:
        pods = self.pods(role)
        return pods[-1] if pods else None

    def print_pod(self, pod: dict[str, Any], rank: Optional[int], follow: bool) -> bool:
        """The pod's log on stdout (followed with `follow`); False, with a note, when it has none to read (its
        container not started, its node gone)."""
        from kubernetes.client.rest import ApiException

        name = pod["metadata"]["name"]
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = _container(pod, LAUNCHER)
        if not _started(pod, container):  # the API server answers an unscheduled pod's log with nothing
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            _note(f"pod {name} has not started its container yet ({phase}); looking in the archive")
            return False
        options: dict[str, Any] = {"follow": follow, "_preload_content": False}
        if len(containers) > 1:
            options["container"] = container
        try:
            response = self.core.read_namespaced_pod_log(name, self.namespace, **options)
        except ApiException as exc:
            _note(f"pod {name} has no log to read ({_api_message(exc)}); looking in the archive")
            return False
        try:
            _write(of_rank(_lines(response.stream(64 * 1024)), rank))
        finally:
            response.release_conn()
        return True

    def preprocessing(self, follow: bool) -> int:
        """The preprocessing pods' logs (those that started), else the ones they archived."""
        pods = [p for p in self.pods(PREPROCESS) if _started(p, _container(p, PREPROCESS))]
        if not pods:
            return self.archived_preprocessing(follow)
        if follow:  # one stream at a time: the newest pod's
            pods = pods[-1:]
        for index, pod in enumerate(pods):
            if len(pods) > 1:
                print(f"{'' if index == 0 else chr(10)}==> pod {pod['metadata']['name']} <==", flush=True)
            self.print_pod(pod, None, follow)
        return OK

    # --- the archive ------------------------------------------------------------------------------

    def _parsed(self):
        from ..schema.validation import InvalidScalingRun, parse_scalingrun

        if self._model is not None:
            return self._model
        body = {k: self.run[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        try:
            self._model = parse_scalingrun(body)
            return self._model
        except InvalidScalingRun as exc:
            raise UserError(f"scalingrun logs: ScalingRun {self.name} has an invalid spec, so no storage to read: "
                            f"{exc.errors[0]}") from None

    def _target(self, run):
        from ..object_store import Store

        storage = run.spec.storage
        credentials = (self._credentials(storage.credentials_secret, storage.access_key_id_key,
                                         storage.secret_access_key_key) if storage.credentials_secret else None)
        return Store(self.endpoint or storage.endpoint, storage.region, credentials, max_bytes=MAX_LOG_BYTES)

    def _credentials(self, secret: str, id_key: str, secret_key: str):
        """The keys in the run's Secret; None (the environment's keys) when it may not be read and those are set."""
        import base64

        from kubernetes.client.rest import ApiException

        from ..object_store import Credentials, secret_key_value

        where = f"Secret {self.namespace}/{secret} (spec.storage.credentialsSecret)"
        try:
            obj = self.core.read_namespaced_secret(secret, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise UserError(f"scalingrun logs: reading {where}: the API server answered {exc.status} "
                                f"{exc.reason}") from None
            if os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"):
                return None
            problem = "may not be read with your credentials" if exc.status == 403 else "does not exist"
            raise UserError(f"scalingrun logs: {where} {problem}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                            "to the store's keys to read the archived logs") from None
        data = json.loads(obj.data).get("data") or {}
        values = []
        try:
            for key in (id_key, secret_key):
                if key not in data:
                    raise ValueError(f"{where} has no key {key!r}")
                values.append(secret_key_value(base64.b64decode(data[key]), f"{where} key {key!r}"))
        except ValueError as exc:
            raise UserError(f"scalingrun logs: {exc}") from None
        return Credentials(values[0], values[1])

    def _archive(self):
        """(status.logs, else where the run's spec puts them; the storage target to read them with)."""
        from ..builders.locations import logs_uri

        run = self._parsed()
        return (self.run.get("status") or {}).get("logs") or logs_uri(run), self._target(run)

    def archived_preprocessing(self, follow: bool) -> int:
        from ..object_store import StorageError, list_names, read_bytes

        logs, target = self._archive()
        folder = f"{logs}/{PREPROCESS_FOLDER}"
        try:
            names = [name for name in list_names(folder, target) if name.endswith(".log")]
            if not names:
                raise UserError(f"scalingrun logs: ScalingRun {self.name} has no preprocessing pods left and no "
                                f"archived preprocessing log in {folder}/ (its dataset was reused, or it has not "
                                "preprocessed yet)")
            _note(f"no live preprocessing pod; {len(names)} archived in {folder}/")
            for index, name in enumerate(names):
                data = read_bytes(f"{folder}/{name}", target) or b""
                if len(names) > 1:
                    print(f"{'' if index == 0 else chr(10)}==> pod {name[:-len('.log')]} <==", flush=True)
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
        except StorageError as exc:
            raise UserError(f"scalingrun logs: {exc}") from None
        if follow:
            _note("nothing to follow: the preprocessing pods are gone")
        return OK

    def archived(self, attempt: Optional[int], rank: Optional[int], follow: bool) -> int:
        from ..object_store import StorageError, list_folders, read_bytes, read_json

        logs, target = self._archive()
        try:
            attempts = sorted(n for n in (attempt_number(f) for f in list_folders(logs, target)) if n)
            if not attempts:
                raise UserError(f"scalingrun logs: ScalingRun {self.name} has no live launcher pod and no archived "
                                f"log in {logs}/ (its training has not started, or its launcher could not write "
                                "there: see `scalingrun get` and the run's conditions)")
            number = attempt or attempts[-1]
            if number not in attempts:
                raise UserError(f"scalingrun logs: no attempt {number} in {logs}/ (archived: "
                                f"{', '.join(map(str, attempts))})")
            folder = f"{logs}/{attempt_folder(number)}"
            record = _record(read_json, f"{folder}/{ATTEMPT_RECORD}", target)
            name = LAUNCHER_LOG if rank is None else rank_log(rank)
            data = read_bytes(f"{folder}/{name}", target)
        except StorageError as exc:
            raise UserError(f"scalingrun logs: {exc}") from None
        if data is None:
            if rank is not None:
                ranks = ", ".join(map(str, record.ranks)) if record and record.ranks else "none"
                raise UserError(f"scalingrun logs: attempt {number} archived no log of rank {rank} in {folder}/ "
                                f"(ranks archived: {ranks})")
            raise UserError(f"scalingrun logs: attempt {number} left no {LAUNCHER_LOG} in {folder}/ "
                            f"({_ended(record)})")
        gone = "" if attempt else "no live launcher pod; "
        _note(f"{gone}attempt {number} of {attempts[-1]} ({_ended(record)}), archived in {folder}/{name}")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        if follow:
            _note("nothing to follow: the attempt has ended and its pod is gone")
        return OK


def _container(pod: dict[str, Any], wanted: str) -> str:
    """The container named `wanted`, else the pod's first."""
    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    return wanted if wanted in names or not names else names[0]


def _started(pod: dict[str, Any], container: str) -> bool:
    """Whether the container has run (or runs): only then has it a log."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            state, last = status.get("state") or {}, status.get("lastState") or {}
            return bool(state.get("running") or state.get("terminated") or last.get("terminated"))
    return False


def _record(read_json, uri: str, target) -> Optional[AttemptRecord]:
    from pydantic import ValidationError

    from ..object_store import StorageError

    try:
        document = read_json(uri, target)
        return AttemptRecord.model_validate(document) if document else None
    except (StorageError, ValidationError):  # a record is a courtesy: the log is what was asked for
        return None


def _ended(record: Optional[AttemptRecord]) -> str:
    if record is None:
        return "no attempt.json"
    if record.state == "running" or not record.ended:
        return f"pod {record.pod}, started {record.started}, not ended: still running, or killed before it could say"
    how = f"stopped by {record.signal}" if record.signal else record.state
    return f"pod {record.pod}, {how}, exit code {record.exit_code}, ended {record.ended}"


def _api_message(exc: Any) -> str:
    try:
        return json.loads(exc.body).get("message") or f"{exc.status} {exc.reason}"
    except (TypeError, ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"
