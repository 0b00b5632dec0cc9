"""Where a submitted run is: a cluster (through the API server, as `scalingrun get` and `logs` reach it) or this
machine (the local runner in a background thread). One protocol, two implementations; `Run` talks to either."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import threading
from pathlib import Path
from typing import Any, Optional, Protocol

from scalingrun_api.models import GROUP, PLURAL, VERSION, ScalingRun
from scalingrun_api.progress import Progress
from scalingrun_operator.builders.common import mpijob_name
from scalingrun_operator.builders.locations import progress_uri
from scalingrun_operator.cli.cluster import Cluster
from scalingrun_operator.cli.loading import UserError
from scalingrun_operator.cli.logs import RunLogs
from scalingrun_operator.decide.pod_facts import LAUNCHER
from scalingrun_operator.documents import parse_progress
from scalingrun_operator.local.runner import LocalRun
from scalingrun_operator.object_store import StorageError, Store, read_json

LOCAL_JOIN_SECONDS = 60.0  # how long delete() waits for a local run's loop once its processes are stopped


class ClusterError(RuntimeError):
    """The cluster refused or could not be reached: the message is the one `scalingrun get` would print."""


class Backend(Protocol):
    where: str

    def status(self) -> dict[str, Any]: ...

    def finished(self) -> bool:
        """True when nothing will change the status any more (the phase says it too, where one was reached)."""

    def progress(self) -> Optional[Progress]: ...

    def logs(self, rank: Optional[int]) -> str: ...

    def delete(self) -> None: ...


class ClusterBackend:
    """A ScalingRun in a cluster: created, read and deleted through the custom objects API."""

    def __init__(self, cluster: Cluster, model: ScalingRun):
        self.cluster, self.model = cluster, model
        self.where = f"namespace {cluster.namespace}"

    @classmethod
    def create(cls, model: ScalingRun, body: dict[str, Any], kubeconfig: Optional[str], context: Optional[str],
               namespace: Optional[str]) -> "ClusterBackend":
        from kubernetes.client.rest import ApiException

        args = argparse.Namespace(kubeconfig=kubeconfig, context=context, all_namespaces=False,
                                  namespace=namespace or model.metadata.namespace)
        try:
            cluster = Cluster(args)
        except UserError as exc:
            raise ClusterError(str(exc)) from None
        body = copy.deepcopy(body)
        body["metadata"]["namespace"] = cluster.namespace
        name = model.metadata.name
        try:
            cluster.api.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)
        except ApiException as exc:
            if exc.status == 409:
                raise ClusterError(f"a ScalingRun {name} exists already in namespace {cluster.namespace}: delete it "
                                   "or give this run another name") from None
            if exc.status == 404:
                raise ClusterError(f"{PLURAL}.{GROUP} is not served by this cluster: install the chart (or "
                                   "`scalingrun crd | kubectl apply --server-side -f -`)") from None
            raise ClusterError(f"the API server refused ScalingRun {name} ({exc.status} {exc.reason}): "
                               f"{_api_message(exc)}") from None
        except Exception as exc:  # urllib3's connection errors
            raise ClusterError(f"cannot reach the API server: {exc}") from None
        return cls(cluster, model)

    def _object(self) -> dict[str, Any]:
        try:
            found = self.cluster.get(PLURAL, self.model.metadata.name)
        except UserError as exc:
            raise ClusterError(str(exc)) from None
        if found is None:
            raise ClusterError(f"ScalingRun {self.model.metadata.name} not found in namespace "
                               f"{self.cluster.namespace} (deleted?)")
        return found

    def status(self) -> dict[str, Any]:
        return self._object().get("status") or {}

    def finished(self) -> bool:
        return False  # the operator goes on until the phase says the run has ended

    def progress(self) -> Optional[Progress]:
        """The progress document, from the run's storage with this environment's keys (AWS_ACCESS_KEY_ID ...)."""
        storage = self.model.spec.storage
        try:
            return parse_progress(read_json(progress_uri(self.model), Store(storage.endpoint, storage.region)))
        except StorageError as exc:
            raise ClusterError(f"ScalingRun {self.model.metadata.name}'s progress document: {exc}") from None

    def logs(self, rank: Optional[int]) -> str:
        """The launcher pod's log while it exists, else the archived one: what `scalingrun logs` prints."""
        logs = RunLogs(self.cluster, self._object(), None)
        buffer = io.BytesIO()
        out = io.TextIOWrapper(buffer, encoding="utf-8", errors="replace")
        try:
            with contextlib.redirect_stdout(out):
                pod = logs.live_pod(LAUNCHER)
                if pod is None or not logs.print_pod(pod, rank, False):
                    logs.archived(None, rank, False)
        except UserError as exc:
            raise ClusterError(str(exc)) from None
        out.flush()
        return buffer.getvalue().decode("utf-8", errors="replace")

    def delete(self) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.cluster.api.delete_namespaced_custom_object(GROUP, VERSION, self.cluster.namespace, PLURAL,
                                                             self.model.metadata.name)
        except ApiException as exc:
            if exc.status != 404:  # gone already: deleted, as asked
                raise ClusterError(f"the API server refused to delete ScalingRun {self.model.metadata.name} "
                                   f"({exc.status} {exc.reason}): {_api_message(exc)}") from None


def _api_message(exc: Any) -> str:
    import json

    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


class RunDeleted(RuntimeError):
    """The local run was deleted: as a cluster's run, it has no status any more (its workdir keeps the last)."""


class _Deleted(Exception):
    """Ends a deleted local run's loop at its next look."""


class DeletableLocalRun(LocalRun):
    """The local runner, whose loop ends at the next look once the run is deleted: the launcher that delete() stops
    is then never judged (a stopped horovodrun may exit 0, which would read as success)."""

    deleted = False

    def look(self, *args: Any, **kwargs: Any) -> Any:
        if self.deleted:
            raise _Deleted()
        return super().look(*args, **kwargs)


class LocalBackend:
    """The local runner (`scalingrun run --local`) in a background thread; its status is the runner's."""

    where = "this machine"

    def __init__(self, local: DeletableLocalRun):
        self.local = local
        self.error: Optional[BaseException] = None
        self.exit_code: Optional[int] = None
        self.thread = threading.Thread(target=self._run, name=f"scalingrun-local-{local.run.metadata.name}",
                                       daemon=True)

    @classmethod
    def start(cls, model: ScalingRun, workdir: Path, python_path: tuple[str, ...]) -> "LocalBackend":
        local = DeletableLocalRun(model, workdir, python_path=python_path)
        local.check_credentials()  # a missing key is the caller's error, raised here rather than in the thread
        backend = cls(local)
        backend.thread.start()
        return backend

    def _run(self) -> None:
        try:
            self.exit_code = self.local.start()
        except _Deleted:
            pass
        except BaseException as exc:  # kept for the caller's next look: a thread's exception reaches no one
            self.error = exc

    def status(self) -> dict[str, Any]:
        if self.local.deleted:
            raise RunDeleted(f"ScalingRun {self.local.run.metadata.name} was deleted; {self.local.status_path} "
                             "keeps its last status and logs/ its processes' output")
        if self.error is not None:
            raise self.error
        return copy.deepcopy(self.local.body["status"])

    def finished(self) -> bool:
        return not self.thread.is_alive()

    def progress(self) -> Optional[Progress]:
        return self.local.progress

    def logs(self, rank: Optional[int]) -> str:
        """Every rank's stdout and stderr (horovodrun's or mpirun's --output-filename files), rank by rank."""
        folder = self.local.workdir / "logs" / mpijob_name(self.local.run)
        texts = []
        for path in sorted(folder.glob("**/rank.*/std*")):
            number = path.parent.name.split(".", 1)[1]
            if number.isdigit() and (rank is None or int(number) == rank):
                texts.append(path.read_text(errors="replace"))
        return "".join(texts)

    def delete(self) -> None:
        """Stops its processes and its loop; its workdir (status.json, logs) stays. Idempotent."""
        self.local.deleted = True  # first: no look after the processes' end may judge them
        self.local.stop_processes()
        self.thread.join(LOCAL_JOIN_SECONDS)
