"""`scalingrun.Run`: a ScalingRun built from a dict, YAML or keyword arguments and checked by the rules `scalingrun
validate` applies (its errors are validate's sentences), then submitted to a cluster or run on this machine and
followed from Python: `wait()`, `status`, `logs()`, `metrics()`, `delete()`."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, Optional, Union

import yaml
from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from scalingrun_api.models import API_VERSION, KIND, Phase, ScalingRun
from scalingrun_operator.cli.commands import invalid
from scalingrun_operator.cli.loading import Document, UserError, yaml_error, is_ours, read_file
from scalingrun_operator.schema import strict_yaml
from scalingrun_operator.schema.findings import SpecWarning
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, spec_warnings
from .backends import Backend, ClusterBackend, LocalBackend
from .display import Display, choose_display

# Where a run built in Python says it came from, in validate's sentences ("<python>: ScalingRun x is invalid: ...").
PYTHON_SOURCE = "<python>"
YAML_SOURCE = "<yaml>"
TERMINAL = (Phase.succeeded.value, Phase.failed.value)


class InvalidRun(ValueError):
    """The run is not a valid ScalingRun: the message is `scalingrun validate`'s, `errors` its lines."""

    def __init__(self, message: str, errors: Optional[list[str]] = None):
        super().__init__(message)
        self.errors = errors if errors is not None else [message]


class RunFailed(RuntimeError):
    """The run ended Failed: the message is its status message; `status` the whole status."""

    def __init__(self, name: str, status: dict[str, Any]):
        super().__init__(f"ScalingRun {name} failed: {status.get('message') or 'no message'}")
        self.status = status


class RunNotSubmitted(RuntimeError):
    """A call that needs the run to be somewhere (status, wait, logs ...) before submit()."""


def _plain(value: Any) -> Any:
    """A pydantic model of the API (Training(max_epochs=2)) as the YAML spells it; anything else as it is."""
    return value.model_dump(mode="json", by_alias=True, exclude_none=True) if isinstance(value, BaseModel) else value


class Run:
    """One ScalingRun. `Run(name, dataset={...}, training={...}, ...)`: the spec's sections as keyword arguments
    (a section's name in Python's spelling or the YAML's; its value a dict in the YAML's spelling or a model of
    scalingrun_api.models); `Run.from_dict(body)` and `Run.from_yaml(path_or_text)` take a whole document."""

    def __init__(self, name: Optional[str] = None, *, namespace: Optional[str] = None,
                 labels: Optional[dict[str, str]] = None, **spec: Any):
        metadata: dict[str, Any] = {"name": name}
        if namespace:
            metadata["namespace"] = namespace
        if labels:
            metadata["labels"] = dict(labels)
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
                "spec": {to_camel(key): _plain(value) for key, value in spec.items()}}
        self._load(body, PYTHON_SOURCE)

    @classmethod
    def from_dict(cls, body: dict[str, Any], source: str = PYTHON_SOURCE) -> "Run":
        run = cls.__new__(cls)
        run._load(copy.deepcopy(body), source)
        return run

    @classmethod
    def from_yaml(cls, path_or_text: Union[str, Path]) -> "Run":
        """The one ScalingRun of a file (a path) or of YAML text, read as `scalingrun validate -f` reads it."""
        try:
            if isinstance(path_or_text, Path) or "\n" not in path_or_text and Path(path_or_text).is_file():
                docs = read_file(str(path_or_text))
            else:
                try:
                    docs = [Document(YAML_SOURCE, body) for body in strict_yaml.load_all(path_or_text)
                            if body is not None]
                except yaml.YAMLError as exc:
                    raise yaml_error(YAML_SOURCE, exc) from None
        except UserError as exc:
            raise InvalidRun(str(exc)) from None
        ours = [doc for doc in docs if is_ours(doc)]
        source = str(path_or_text) if docs and docs[0].source != YAML_SOURCE else YAML_SOURCE
        if len(ours) != 1:
            raise InvalidRun(f"{source}: expected one {KIND}, found {len(ours)}")
        return cls.from_dict(ours[0].body, ours[0].source)

    def _load(self, body: Any, source: str) -> None:
        try:
            self.model: ScalingRun = parse_scalingrun(body)
        except InvalidScalingRun as exc:
            raise InvalidRun(str(invalid(Document(source, body), exc)), [str(e) for e in exc.errors]) from None
        self.body: dict[str, Any] = body
        self.source = source
        self._backend: Optional[Backend] = None

    # --- what it is ---------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.model.metadata.name

    @property
    def warnings(self) -> list[SpecWarning]:
        """What a valid run may not mean, as `scalingrun validate` prints it (the operator posts them as Events)."""
        return spec_warnings(self.model)

    def to_yaml(self) -> str:
        """The document as submitted (`kubectl apply -f` takes it)."""
        return yaml.safe_dump(self.body, sort_keys=False)

    def __repr__(self) -> str:
        where = f", {self._backend.where}" if self._backend else ""
        return f"Run({self.name!r}{where})"

    # --- where it runs ------------------------------------------------------------------------------------

    def submit(self, *, local: bool = False, kubeconfig: Optional[str] = None, context: Optional[str] = None,
               namespace: Optional[str] = None, workdir: Optional[Union[str, Path]] = None,
               python_path: tuple[str, ...] = ()) -> "Run":
        """Creates the ScalingRun in the cluster of `kubeconfig` (else $KUBECONFIG, ~/.kube/config or the pod's
        service account), in `namespace` (else the document's, else the context's); with `local=True` runs it on
        this machine instead, in the background (`workdir`, default .scalingrun/runs/<name>; s3:// keys from the
        environment, as `scalingrun run --local` takes them). Returns the run, to chain `.wait()`."""
        if self._backend is not None:
            raise RuntimeError(f"ScalingRun {self.name} was submitted already ({self._backend.where})")
        if local:
            folder = Path(workdir) if workdir else Path(".scalingrun/runs") / self.name
            self._backend = LocalBackend.start(self.model, folder, tuple(python_path))
        else:
            self._backend = ClusterBackend.create(self.model, self.body, kubeconfig, context, namespace)
        return self

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RunNotSubmitted(f"ScalingRun {self.name} has not been submitted: call submit() first")
        return self._backend

    @property
    def status(self) -> dict[str, Any]:
        """The run's status as the API server (or the local runner's status.json) holds it."""
        return self.backend.status()

    @property
    def phase(self) -> Optional[str]:
        return self.status.get("phase")

    def wait(self, timeout: Optional[float] = None, progress: bool = True, poll_seconds: float = 2.0,
             display: Optional[Display] = None) -> dict[str, Any]:
        """Until the run has ended: its status when Succeeded; RunFailed (its status message) when Failed,
        TimeoutError after `timeout` seconds. With `progress`, epochs, ETA and images/s as they come (tqdm where
        it is installed, else a line per change)."""
        backend = self.backend
        shown = display or choose_display(self.name, progress)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                status = backend.status()
                shown.update(status)
                if status.get("phase") in TERMINAL or backend.finished():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"ScalingRun {self.name} is still {status.get('phase') or 'not started'} after "
                                       f"{timeout:g} s")
                time.sleep(poll_seconds)
        finally:
            shown.close()
        status = backend.status()
        if status.get("phase") != Phase.succeeded.value:
            raise RunFailed(self.name, status)
        return status

    def logs(self, rank: Optional[int] = None) -> str:
        """The training's log (every rank's lines), or rank `rank`'s: as `scalingrun logs` prints it."""
        return self.backend.logs(rank)

    def metrics(self) -> Any:
        """One row per epoch (epoch, images_per_second and the framework's metrics): a pandas DataFrame where pandas
        is installed, else a list of dicts. From the progress document (a cluster run's: read from its storage with
        the environment's keys)."""
        progress = self.backend.progress()
        rows = [{"epoch": e.epoch, "images_per_second": e.images_per_second, **e.metrics}
                for e in (progress.history if progress else [])]
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows, columns=list(rows[0]) if rows else ["epoch", "images_per_second"])

    def report(self, output: Union[str, Path] = ".") -> tuple[Path, Path]:
        """What `scalingrun report` writes: <output>/<run>-report.png (the curves; an elastic run's workers over
        time) and -report.md; needs matplotlib. ValueError before an epoch has finished."""
        import datetime as dt

        from scalingrun_operator.report.run import render_report, workers_over_time

        progress = self.backend.progress()
        if progress is None:
            raise ValueError(f"ScalingRun {self.name} has no progress document yet")
        workers = workers_over_time(self.status, self.model.spec.workers.gpus_per_worker,
                                    dt.datetime.now(dt.timezone.utc))
        return render_report(progress, self.name, Path(output), workers)

    def delete(self) -> None:
        """Deletes the ScalingRun (its children go with it); a local run's processes are stopped. Deleting a run
        that is gone already is no error."""
        self.backend.delete()
