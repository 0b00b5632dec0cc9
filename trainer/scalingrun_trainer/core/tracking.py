"""MLflow experiment tracking from rank 0, over MLflow's REST API (2.0, stable since MLflow 1.x).

The standard library only: the trainer image stays free of mlflow-skinny's closure (protobuf,
OpenTelemetry, databricks-sdk pins that a TensorFlow 2.15 stack has to fight). Credentials come from
MLflow's own variables, which the operator fills from a Secret: MLFLOW_TRACKING_TOKEN (bearer) or
MLFLOW_TRACKING_USERNAME + MLFLOW_TRACKING_PASSWORD (basic auth).

Failure policy: a server that cannot be reached or refuses the run at start is a configuration error
(the trainer stops before spending GPU time); once training runs, a lost metric is a warning, not a
reason to throw away the epochs.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from scalingrun_api.config import TrainerConfig

# Tags the MLflow run with where its checkpoints and progress document are, to find one from the other.
RUN_LOCATION_TAG = "scalingrun.dev/run-location"
RETRYABLE_STATUS = {429, 500, 502, 503, 504}


class TrackingError(RuntimeError):
    """The tracking server refused a call or cannot be reached; the message says which and why."""


class MlflowClient:
    def __init__(self, uri: str, *, token: Optional[str] = None, username: Optional[str] = None,
                 password: Optional[str] = None, timeout: float = 30.0, retries: int = 3, backoff: float = 1.0):
        self.uri = uri.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._auth: Optional[str] = None
        if token:
            self._auth = f"Bearer {token}"
        elif username and password:
            self._auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    @classmethod
    def from_env(cls, uri: str, **kwargs) -> "MlflowClient":
        env = os.environ
        return cls(uri, token=env.get("MLFLOW_TRACKING_TOKEN"), username=env.get("MLFLOW_TRACKING_USERNAME"),
                   password=env.get("MLFLOW_TRACKING_PASSWORD"), **kwargs)

    def call(self, method: str, endpoint: str, payload: Optional[dict] = None) -> dict[str, Any]:
        """One REST call; retries on connection errors and 429/5xx, raises TrackingError otherwise."""
        url = f"{self.uri}/api/2.0/mlflow/{endpoint}"
        data = None
        if method == "GET" and payload:
            url += "?" + urllib.parse.urlencode(payload)
        elif payload is not None:
            data = json.dumps(payload).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
            if self._auth:
                request.add_header("Authorization", self._auth)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                return json.loads(body) if body else {}
            except urllib.error.HTTPError as exc:
                detail = _error_detail(exc)
                if exc.code not in RETRYABLE_STATUS or attempt == self.retries:
                    raise TrackingError(f"MLflow at {self.uri} answered {exc.code} to {endpoint}: {detail}") from None
            except (urllib.error.URLError, OSError) as exc:
                if attempt == self.retries:
                    reason = getattr(exc, "reason", exc)
                    raise TrackingError(f"cannot reach MLflow at {self.uri} ({reason})") from None
            time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")

    def experiment_id(self, name: str) -> str:
        """The experiment's id, creating it when missing (tolerating a concurrent creator)."""
        try:
            return self.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"]["experiment_id"]
        except TrackingError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise
        try:
            return self.call("POST", "experiments/create", {"name": name})["experiment_id"]
        except TrackingError as exc:
            if "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise
            return self.call("GET", "experiments/get-by-name", {"experiment_name": name})["experiment"]["experiment_id"]

    def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> str:
        payload = {"experiment_id": experiment_id, "run_name": run_name, "start_time": _now_ms(),
                   "tags": [{"key": k, "value": str(v)} for k, v in tags.items()]}
        return self.call("POST", "runs/create", payload)["run"]["info"]["run_id"]

    def get_run(self, run_id: str) -> Optional[dict[str, Any]]:
        try:
            return self.call("GET", "runs/get", {"run_id": run_id})["run"]
        except TrackingError as exc:
            if "RESOURCE_DOES_NOT_EXIST" in str(exc) or " 404 " in str(exc):
                return None
            raise

    def log_batch(self, run_id: str, *, metrics: Optional[dict[str, float]] = None, step: int = 0,
                  params: Optional[dict[str, Any]] = None, tags: Optional[dict[str, Any]] = None) -> None:
        now = _now_ms()
        self.call("POST", "runs/log-batch", {
            "run_id": run_id,
            "metrics": [{"key": k, "value": float(v), "timestamp": now, "step": step} for k, v in (metrics or {}).items()],
            "params": [{"key": k, "value": str(v)} for k, v in (params or {}).items()],
            "tags": [{"key": k, "value": str(v)} for k, v in (tags or {}).items()],
        })

    def set_status(self, run_id: str, status: str) -> None:
        """RUNNING, FINISHED, FAILED or KILLED; an end time with the terminal ones."""
        payload: dict[str, Any] = {"run_id": run_id, "status": status}
        if status != "RUNNING":
            payload["end_time"] = _now_ms()
        self.call("POST", "runs/update", payload)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace")
    except OSError:
        body = ""
    try:
        parsed = json.loads(body)
        return f"{parsed.get('error_code', 'ERROR')}: {parsed.get('message', '')}".strip()
    except ValueError:
        return (body.strip().splitlines() or [exc.reason or "no detail"])[0][:300]


class RunTracker:
    """Rank 0's MLflow run: parameters at start, metrics per epoch (step = epoch), best metrics, the
    model URI and a terminal status at the end. A resumed training continues the same MLflow run."""

    def __init__(self, client: MlflowClient, warn: Callable[[str], None] = print):
        self.client = client
        self.warn = warn
        self.run_id: Optional[str] = None

    def start(self, *, experiment: str, run_name: str, run_location: str, params: dict[str, Any],
              resume_run_id: Optional[str] = None) -> str:
        if resume_run_id and self.client.get_run(resume_run_id) is not None:
            self.run_id = resume_run_id
            self.client.set_status(self.run_id, "RUNNING")
            return self.run_id
        experiment_id = self.client.experiment_id(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name, {
            "mlflow.runName": run_name, RUN_LOCATION_TAG: run_location, "mlflow.source.name": "scalingrun-trainer",
        })
        # MLflow params are write-once: logged for a new run only, never again on resume.
        self.client.log_batch(self.run_id, params=params)
        return self.run_id

    def epoch(self, epoch: int, metrics: dict[str, float], images_per_second: float) -> None:
        self._quietly(lambda: self.client.log_batch(
            self.run_id, metrics={**metrics, "images_per_second": images_per_second}, step=epoch))

    def finish(self, status: str, *, best_epoch: Optional[int] = None, best_metrics: Optional[dict] = None,
               model_uri: Optional[str] = None, error: Optional[str] = None) -> None:
        if self.run_id is None:
            return
        tags = {"scalingrun.dev/model-uri": model_uri} if model_uri else {}
        if error:
            tags["scalingrun.dev/error"] = error[:5000]
        metrics = {f"best_{k}": v for k, v in (best_metrics or {}).items()}
        if best_epoch is not None:
            metrics["best_epoch"] = best_epoch
        self._quietly(lambda: self.client.log_batch(self.run_id, metrics=metrics, step=best_epoch or 0, tags=tags))
        self._quietly(lambda: self.client.set_status(self.run_id, status))

    def _quietly(self, call: Callable[[], None]) -> None:
        try:
            call()
        except TrackingError as exc:
            self.warn(f"warning: MLflow: {exc} (the progress document still has every metric)")


def start_tracking(config: "TrainerConfig", rank: int, run_location: str, params: dict[str, Any],
                   resume_run_id: Optional[str], log: Callable[[str], None],
                   broadcast: Callable[[Optional[str]], Optional[str]]) -> Optional["RunTracker"]:
    """Rank 0 opens (or, on resume, reopens) the MLflow run; a failure stops every rank with its cause.

    `broadcast` sends rank 0's error (or None) to every rank: the engine's collective.
    """
    if config.tracking is None:
        return None
    uri = config.tracking.mlflow_tracking_uri
    tracker, error = None, None
    if rank == 0:
        tracker = RunTracker(MlflowClient.from_env(uri), warn=log)
        try:
            experiment = config.tracking.experiment_name or config.run
            tracker.start(experiment=experiment, run_name=config.run, run_location=run_location, params=params,
                          resume_run_id=resume_run_id)
            log(f"MLflow: run {tracker.run_id} in experiment {experiment!r} at {uri}")
        except TrackingError as exc:
            error = str(exc)
            tracker.finish("FAILED", error=error)  # a run created before the failure is not left RUNNING
    error = broadcast(error)
    if error:
        raise TrackingError(f"{error}: check spec.tracking and its credentialsSecret")
    return tracker
