"""One reconcile of one ScalingRun: read what exists, decide with the pure helpers, act, write status.

Level-triggered on purpose: every trigger (create, resume, spec change, a child's or pod's event, a
changed progress document, a recheck) runs the same function, which looks at the run, its children
and the two storage documents as they are now. An operator killed at any point therefore converges on restart: children are created only
if absent (409 -> adopt), the phase is derived from what the children report, and status is written
with the resourceVersion it was computed from (a conflict re-reads and recomputes).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Optional

from kubernetes.client.rest import ApiException

from .. import metrics
from scalingrun_api.models import API_VERSION, KIND, Phase, ScalingRun
from ..api.validation import InvalidScalingRun, parse_scalingrun
from ..builders import build_config_map, build_mpijob, build_preprocess_job
from ..builders.common import mpijob_name, preprocess_job_name
from ..config import Config
from ..k8s import Kube
from ..progress_watch import ProgressWatcher
from ..status import (
    BACKOFF_LIMIT_EXCEEDED, CHILD_DELETED,
    DATASET_REUSED, FAILED, INVALID_SPEC, MPIJOB_FAILED, PODS_HEALTHY, PREPROCESSED, PREPROCESSING_FAILED, READY,
    SPEC_CHANGE_IGNORED, STORAGE_READABLE, SUSPENDED, TRAINED, Event, StatusUpdate, get_condition, is_terminal,
    may_revalidate, parse_time,
)
from ..storage import (
    StorageError, StorageTarget, endpoint_refusal, list_names, read_json, read_json_versioned, uses_s3,
)
from ..status import INPUT_BOUND
from . import dataset, pods as pod_diagnosis, spec as pinning, training

log = logging.getLogger(__name__)

_locks_guard = threading.Lock()
_locks: dict[tuple[str, str], threading.Lock] = {}


def _lock(namespace: str, name: str) -> threading.Lock:
    """Serialises reconciles of one run inside this process (handlers, the watcher and child events overlap)."""
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def forget(namespace: str, name: str) -> None:
    with _locks_guard:
        _locks.pop((namespace, name), None)


# --- pod watch events ------------------------------------------------------------------------------

_pods_guard = threading.Lock()
_pod_signatures: dict[str, tuple] = {}
_deleted_pods: "OrderedDict[str, str]" = OrderedDict()  # uid -> how the pod was when it was deleted
_MAX_REMEMBERED = 5000


def pod_event_matters(event_type: Optional[str], pod: dict[str, Any]) -> bool:
    """Whether a pod's watch event changes anything a reconcile looks at (kubelets update pods often).

    The initial listing only primes the memory: every run is reconciled on resume anyway.
    """
    uid = (pod.get("metadata") or {}).get("uid", "")
    with _pods_guard:
        if event_type == "DELETED":
            _pod_signatures.pop(uid, None)
            _deleted_pods[uid] = pod_diagnosis.last_words(pod)
            while len(_deleted_pods) > _MAX_REMEMBERED:
                _deleted_pods.popitem(last=False)
            return True
        if len(_pod_signatures) > _MAX_REMEMBERED:  # DELETED events missed across watch gaps: start over
            _pod_signatures.clear()
        known = _pod_signatures.get(uid)
        signature = pod_diagnosis.signature(pod)
        _pod_signatures[uid] = signature
        if event_type is None:
            return known is not None and known != signature
        return known != signature


_child_signatures: dict[str, tuple] = {}


def child_event_matters(event_type: Optional[str], child: dict[str, Any]) -> bool:
    """Whether a Job's or MPIJob's watch event changes what a reconcile reads of it (its status, the spec fields
    read, its controller), or deletes it. kopf re-lists every watched kind whenever a watch ends: without this,
    every run with children would be reconciled each time, with nothing changed. The operator's own creation of
    a child (no status yet) is no news either.
    """
    meta = child.get("metadata") or {}
    uid = meta.get("uid", "")
    spec = child.get("spec") or {}
    signature = (json.dumps(child.get("status") or {}, sort_keys=True), spec.get("completions"),
                 spec.get("completionMode"), (spec.get("runPolicy") or {}).get("suspend"),
                 tuple(sorted(r.get("uid", "") for r in meta.get("ownerReferences") or [] if r.get("controller"))),
                 bool(meta.get("deletionTimestamp")))
    with _pods_guard:
        if event_type == "DELETED":
            _child_signatures.pop(uid, None)
            return True
        if len(_child_signatures) > _MAX_REMEMBERED:  # DELETED events missed across watch gaps: start over
            _child_signatures.clear()
        known = _child_signatures.get(uid)
        _child_signatures[uid] = signature
        if known is None:
            # First sight: the initial listing (every run is reconciled on resume anyway), or a creation, which
            # matters only with a status already (not one this operator just made).
            return event_type is not None and bool(child.get("status"))
        return known != signature


def deleted_pod_hints() -> dict[str, str]:
    with _pods_guard:
        return dict(_deleted_pods)


@dataclass
class Reconciler:
    kube: Kube
    config: Config
    watcher: Optional[ProgressWatcher] = None  # follows progress documents and rechecks; none in tools

    def __call__(self, namespace: str, name: str) -> Optional[str]:
        """Reconciles one run; returns its phase (None when it is gone)."""
        with _lock(namespace, name):
            attempt = passes = 0
            while attempt < 4:
                body = self.kube.get_run(namespace, name)
                if body is None or body["metadata"].get("deletionTimestamp"):
                    self._follow(namespace, name, None)
                    return None
                try:
                    step = _Pass(self, body)
                    phase = step.run()
                except ApiException as exc:
                    if exc.status == 409 and attempt < 3:
                        log.debug("%s/%s changed while reconciling; again", namespace, name)
                        attempt += 1
                        continue
                    if exc.status == 403 and "being terminated" in str(exc.body):
                        return None  # the namespace is going away, and the run with it
                    raise
                self._follow(namespace, name, step)
                if step.again and passes < 2:
                    passes += 1  # a deleted child was counted (and that written): now recreate it
                    continue
                return phase
        return None

    def _follow(self, namespace: str, name: str, step: Optional["_Pass"]) -> None:
        """Tells the watcher what this run waits on that no Kubernetes event will announce."""
        if self.watcher is None:
            return
        if step is None:
            self.watcher.forget(namespace, name)
            return
        if step.progress is not None:
            self.watcher.watch(namespace, name, *step.progress)
        else:
            self.watcher.unwatch(namespace, name)
        if step.recheck_in is not None:
            self.watcher.schedule_recheck(namespace, name, step.recheck_in)


class _Pass:
    """The state of one reconcile pass (one fresh read of the run)."""

    def __init__(self, reconciler: Reconciler, body: dict[str, Any]):
        self.kube = reconciler.kube
        self.config = reconciler.config
        self.body = body
        meta = body["metadata"]
        self.namespace, self.name = meta["namespace"], meta["name"]
        self.resource_version = meta.get("resourceVersion")
        self.update = StatusUpdate(body.get("status") or {}, meta.get("generation"))
        self._target: Optional[StorageTarget] = None
        self._pods: Optional[list[dict[str, Any]]] = None
        self._holdup = ""  # what a pod problem holds the run up with, for status.message
        self.progress: Optional[tuple[str, StorageTarget, Optional[str]]] = None  # (uri, target, version) to watch
        self.recheck_in: Optional[float] = None  # seconds until this run needs another look
        self.again = False  # a deleted child was counted: another pass creates it anew

    # --- entry ---------------------------------------------------------------------------------

    def run(self) -> Optional[str]:
        status = self.body.get("status") or {}
        generation = self.body["metadata"].get("generation")
        if is_terminal(status):
            if not may_revalidate(status, generation):
                return status.get("phase")
            self._restart_after_invalid_spec()
        annotations = self.body["metadata"].get("annotations") or {}
        pinned = annotations.get(pinning.PINNED_ANNOTATION)
        run = self._parse(pinning.effective_spec(self.body["spec"], pinned))
        if run is None:
            return self._write()
        if self.update.phase is None:
            self.update.set_phase(Phase.pending.value, "accepted")
        if pinned is None:
            self._pin()
        else:
            self._record_ignored_changes(pinned)
        if not self._condition_true(PREPROCESSED):
            self._preprocess(run)
        if self._condition_true(PREPROCESSED) and not is_terminal(self.update.desired):
            self._train(run)
        if is_terminal(self.update.desired):
            self.progress, self.recheck_in, self.again = None, None, False  # nothing left to wait for
        return self._write()

    def _parse(self, spec_doc: dict[str, Any]) -> Optional[ScalingRun]:
        document = {"apiVersion": API_VERSION, "kind": KIND, "metadata": self.body["metadata"], "spec": spec_doc}
        try:
            run = parse_scalingrun(document)
        except InvalidScalingRun as exc:
            message = "; ".join(str(e) for e in exc.errors[:10]) + ". Fix the spec (the run is retried on edit)."
            self.update.fail(INVALID_SPEC, message)
            return None
        refusal = endpoint_refusal(run.spec.storage.endpoint, self.config.allowed_storage_endpoints)
        if refusal:  # the operator's own rule, not the API's: refused before any child or storage request
            self.update.fail(INVALID_SPEC, f"{refusal} (the run is retried on edit).")
            return None
        return run

    def _restart_after_invalid_spec(self) -> None:
        desired = self.update.desired
        desired["conditions"] = [c for c in desired["conditions"] if c.get("type") != FAILED]
        desired.pop("completionTime", None)
        self.update.set_phase(Phase.pending.value, "spec edited after InvalidSpec; validating again")

    def _pin(self) -> None:
        patched = self.kube.patch_run_annotations(
            self.namespace, self.name, {pinning.PINNED_ANNOTATION: pinning.pin(self.body["spec"])},
            resource_version=self.resource_version)
        self.resource_version = patched["metadata"]["resourceVersion"]

    def _record_ignored_changes(self, pinned: str) -> None:
        changed = pinning.ignored_changes(self.body["spec"], pinned)
        existing = get_condition(self.update.desired["conditions"], SPEC_CHANGE_IGNORED)
        if changed:
            message = pinning.ignored_message(changed)
            if not existing or existing.get("status") != "True" or existing.get("message") != message:
                self.update.warn("SpecChangeIgnored", message)
            self.update.condition(SPEC_CHANGE_IGNORED, "True", "ImmutableFieldChanged", message)
        elif existing and existing.get("status") == "True":
            self.update.condition(SPEC_CHANGE_IGNORED, "False", "SpecMatches",
                                  "the spec matches the one the run started with")

    def _condition_true(self, type_: str) -> bool:
        condition = get_condition(self.update.desired["conditions"], type_)
        return bool(condition and condition.get("status") == "True")

    # --- storage -------------------------------------------------------------------------------

    def _storage(self, run: ScalingRun) -> StorageTarget:
        if self._target is None:
            s = run.spec.storage
            credentials = None
            if s.credentials_secret and uses_s3(run.spec.dataset.output, run.spec.training.checkpoint.location):
                credentials = self.kube.read_credentials(self.namespace, s.credentials_secret,
                                                         s.access_key_id_key, s.secret_access_key_key)
            self._target = self.config.storage_target(s, credentials)
        return self._target

    def _recheck(self, seconds: float) -> None:
        self.recheck_in = seconds if self.recheck_in is None else min(self.recheck_in, seconds)

    def _read(self, run: ScalingRun, uri: str, versioned: bool = False) -> tuple[bool, Optional[dict[str, Any]]]:
        """(readable, document). An unreadable store is a condition and a Warning, not a crash.

        `versioned`: the document's version is kept too, for the progress watcher."""
        try:
            if versioned:
                document, version = read_json_versioned(uri, self._storage(run))
                self.progress = (uri, self._storage(run), version)
            else:
                document = read_json(uri, self._storage(run))
        except StorageError as exc:
            existing = get_condition(self.update.desired["conditions"], STORAGE_READABLE)
            if not existing or existing.get("status") != "False":
                self.update.warn("StorageUnreadable", str(exc))
            self.update.condition(STORAGE_READABLE, "False", exc.reason,
                                  f"{exc}; retrying every {self.config.recheck_interval_seconds:g} s")
            self._recheck(self.config.recheck_interval_seconds)
            return False, None
        existing = get_condition(self.update.desired["conditions"], STORAGE_READABLE)
        if existing and existing.get("status") != "True":
            self.update.condition(STORAGE_READABLE, "True", "Readable", f"read {uri}")
        return True, document

    # --- children ------------------------------------------------------------------------------

    def _controls(self, child: dict[str, Any]) -> bool:
        uid = self.body["metadata"].get("uid")
        return any(r.get("controller") and r.get("uid") == uid for r in child["metadata"].get("ownerReferences") or [])

    def _indexed(self, run: ScalingRun) -> bool:
        return run.spec.dataset.preprocessing.parallelism == 1 or self.kube.supports_indexed_jobs()

    def _ensure(self, obj: dict[str, Any]) -> dict[str, Any]:
        child, created = self.kube.ensure_child(obj, owner=self.body, observe=metrics.observe_child_created)
        if created:
            born = parse_time(self.body["metadata"].get("creationTimestamp"))
            if born:
                seconds = max(0.0, (self.update.moment - born).total_seconds())
                metrics.RUN_TO_CHILD_SECONDS.labels(kind=obj["kind"]).observe(seconds)
            log.info("created %s %s/%s", obj["kind"], self.namespace, obj["metadata"]["name"])
        return child

    # --- pods ----------------------------------------------------------------------------------

    def _run_pods(self) -> list[dict[str, Any]]:
        if self._pods is None:
            self._pods = self.kube.list_pods(self.namespace, self.name)
        return self._pods

    def _check_pods(self, roles: tuple[str, ...], mpijob: Optional[str] = None) -> Optional[tuple[str, str]]:
        """PodsHealthy from the pods of `roles`; returns the problem's (reason, message), if any.

        A Warning Event goes out once per new cause (reason and pod), not on every kubelet retry.
        """
        problem, count = pod_diagnosis.diagnose(self.namespace, self._run_pods(), roles, mpijob,
                                                now=self.update.moment)
        pending = [p for p, _ in pod_diagnosis.pods_of(self._run_pods(), roles, mpijob)]
        delay = pod_diagnosis.next_pending_check(pending, self.update.moment)
        if delay is not None:  # a pod may stay Pending without a single watch event: look again then
            self._recheck(delay)
        existing = get_condition(self.update.desired["conditions"], PODS_HEALTHY)
        if problem is None:
            if existing and existing.get("status") == "False":
                self.update.condition(PODS_HEALTHY, "True", "PodsRunning", "no pod of the run reports a problem")
            return None
        message = pod_diagnosis.problem_message(problem, count)
        same_cause = (existing is not None and existing.get("status") == "False"
                      and existing.get("reason") == problem.reason
                      and str(existing.get("message") or "").startswith(f"pod {problem.pod} "))
        if not same_cause:
            self.update.warn(problem.reason, message)
        self.update.condition(PODS_HEALTHY, "False", problem.reason, message)
        self._holdup = f"{problem.reason}: {message}"
        return problem.reason, message

    def _pod_cause(self, roles: tuple[str, ...], mpijob: Optional[str] = None) -> str:
        """What the pods of `roles` say went wrong (an OOMKilled worker, say), for a failure's message; the
        PodsHealthy condition says it too. '' when no pod says anything."""
        problem, count = pod_diagnosis.diagnose(self.namespace, self._run_pods(), roles, mpijob)
        if problem is None:
            return ""
        message = pod_diagnosis.problem_message(problem, count)
        self.update.condition(PODS_HEALTHY, "False", problem.reason, message)
        return message

    def _pods_done(self) -> None:
        """A run that succeeded has no pod problem left to report."""
        existing = get_condition(self.update.desired["conditions"], PODS_HEALTHY)
        if existing and existing.get("status") == "False":
            self.update.condition(PODS_HEALTHY, "True", "Finished", "the run's pods have finished")

    # --- preprocessing -------------------------------------------------------------------------

    def _preprocess(self, run: ScalingRun) -> None:
        job_name = preprocess_job_name(run)
        job = self.kube.get_child("Job", self.namespace, job_name)
        recorded = self.update.desired.get("preprocessing") or {}
        if job is None and recorded.get("jobName") == job_name and not recorded.get("reused"):
            # Status names the Job only once it existed: it was deleted. Counted and written first (the name
            # cleared), then the next pass creates it: a crash in between neither loses nor repeats the count.
            self.update.desired["preprocessing"] = {**recorded, "jobName": None}
            self._child_deleted(run, "Job", job_name, "a new Job reuses the shards already written")
            return
        if job is not None and not self._controls(job):
            # Adopted when it has no controller; one that another run controls raises ForeignObject (retried).
            job = self._ensure(build_preprocess_job(run, self.namespace, indexed=self._indexed(run)))
        if job is None:
            readable, manifest = self._read(run, dataset.manifest_uri(run))
            if not readable:
                return
            if dataset.dataset_present(run, manifest):
                self.update.desired["preprocessing"] = dataset.preprocessing_status(manifest, None, reused=True)
                self.update.condition(PREPROCESSED, "True", DATASET_REUSED,
                                      dataset.preprocessed_message(run, manifest, reused=True))
                return
            self._ensure(build_config_map(run, self.namespace))
            job = self._ensure(build_preprocess_job(run, self.namespace, indexed=self._indexed(run)))
            note = dataset.mismatch(run, manifest)
            if note:
                # Posted now, not with the status patch: if that patch conflicts, the retry finds the Job
                # already there and would never say why it was created.
                message = f"{dataset.manifest_uri(run)}: {note}"
                self.kube.post_event(self.body, "Normal", "PreprocessingAgain", message)
                log.info("%s/%s: PreprocessingAgain %s", self.namespace, self.name, message)
        state = dataset.job_state(job)
        shards = run.spec.dataset.preprocessing.parallelism
        self.update.desired["preprocessing"] = {
            **(self.update.desired.get("preprocessing") or {}), "jobName": job_name, "reused": False,
            "shards": shards}
        if state.state == "Running" and dataset.lacks_completion_index(job, shards):
            message = dataset.no_completion_index_message(job_name, shards, self.kube.server_version()[2])
            self.update.condition(PREPROCESSED, "False", PREPROCESSING_FAILED, message)
            self.update.fail(PREPROCESSING_FAILED, message)
        elif state.state == "Running":
            progress, started = dataset.job_progress_message(job_name, state, shards), f"Job {job_name}"
            if dataset.runs_shards_in_turn(job, shards):
                # Said in the condition and in the phase's Event: the run is slower than its spec suggests.
                note = dataset.in_turn_note(shards, self.kube.server_version()[2])
                progress, started = f"{progress}; {note}", f"{started}; {note}"
            holdup = self._check_pods((pod_diagnosis.PREPROCESS,))
            self.update.condition(PREPROCESSED, "Unknown", holdup[0] if holdup else "Running",
                                  f"{progress}; {holdup[1]}" if holdup else progress)
            self.update.set_phase(Phase.preprocessing.value, started)
        elif state.state == "Failed":
            self._preprocessing_failed(run, job_name, state)
        else:
            self._preprocessing_complete(run, job_name, state)

    def _preprocessing_complete(self, run: ScalingRun, job_name: str, state: dataset.JobState) -> None:
        readable, manifest = self._read(run, dataset.manifest_uri(run))
        if not readable:
            return
        if dataset.dataset_present(run, manifest):
            self.update.desired["preprocessing"] = dataset.preprocessing_status(manifest, job_name, reused=False)
            self.update.condition(PREPROCESSED, "True", "Preprocessed",
                                  f"Job {job_name}: " + dataset.preprocessed_message(run, manifest, reused=False))
            return
        if self._within_grace(state.finished_at):
            self._recheck(self._grace_left(state.finished_at))
            self.update.condition(PREPROCESSED, "Unknown", "WaitingForManifest",
                                  f"Job {job_name} completed; waiting for {dataset.manifest_uri(run)}")
            self.update.set_phase(Phase.preprocessing.value)
            return
        found = dataset.mismatch(run, manifest) or "there is none"
        message = (f"Job {job_name} completed but {dataset.manifest_uri(run)} does not describe this run's dataset "
                   f"({found}); check that nothing else writes to spec.dataset.output")
        self.update.condition(PREPROCESSED, "False", PREPROCESSING_FAILED, message)
        self.update.fail(PREPROCESSING_FAILED, message)

    def _preprocessing_failed(self, run: ScalingRun, job_name: str, state: dataset.JobState) -> None:
        try:
            names: Optional[list[str]] = list_names(dataset.shards_uri(run), self._storage(run))
        except StorageError as exc:
            log.warning("cannot list shard manifests of %s/%s: %s", self.namespace, self.name, exc)
            names = None
        done = dataset.shard_progress(names, run.spec.dataset.preprocessing.parallelism)
        message = dataset.preprocessing_failure_message(run, self.namespace, job_name, state, done)
        cause = self._pod_cause((pod_diagnosis.PREPROCESS,))
        if cause:
            message = f"{message}; {cause}"
        self.update.condition(PREPROCESSED, "False", PREPROCESSING_FAILED, message)
        self.update.fail(PREPROCESSING_FAILED, message)

    # --- training ------------------------------------------------------------------------------

    def _train(self, run: ScalingRun) -> None:
        name = mpijob_name(run)
        mpijob = self.kube.get_child("MPIJob", self.namespace, name)
        if mpijob is not None and not self._controls(mpijob):
            mpijob = self._ensure(build_mpijob(run, self.namespace))  # adopt an orphan; another run's: ForeignObject
        recorded = (self.update.desired.get("training") or {}).get("mpiJobUid")
        resumes = ("a new MPIJob resumes from the last checkpoint" if run.spec.training.resume
                   else "a new MPIJob starts over (spec.training.resume is false)")
        trained = get_condition(self.update.desired["conditions"], TRAINED) or {}
        if mpijob is None and recorded and trained.get("reason") == "WaitingForProgress":
            # It had succeeded, and its ttlSecondsAfterFinished removed it: no interruption, judged on what is there.
            _, progress = self._read(run, training.progress_uri(run))
            message = training.succeeded_message(name, progress)
            self.update.condition(TRAINED, "True", "Succeeded", message)
            self._pods_done()
            self.update.set_phase(Phase.succeeded.value, message)
            return
        if mpijob is None and recorded:
            # As for the Job: counted and written (the uid cleared), then the next pass creates a new one.
            self._forget_mpijob(mpijob=None)
            self._child_deleted(run, "MPIJob", name, resumes)
            return
        if mpijob is not None and recorded and recorded != mpijob["metadata"].get("uid"):
            # Deleted and created again by someone else while nobody looked: counted all the same.
            self._forget_mpijob(mpijob)
            if self._child_deleted(run, "MPIJob", name, "the MPIJob there now resumes from the last checkpoint",
                                   replaced=True):
                self._stop_training(name, training.mpijob_state(mpijob))
                return
        if mpijob is None:
            self._ensure(build_config_map(run, self.namespace))
            mpijob = self._ensure(build_mpijob(run, self.namespace))
        state = training.mpijob_state(mpijob)
        wanted_suspend = run.spec.run_policy.suspend
        patch = training.suspend_patch(wanted_suspend, state)
        if patch:
            self.kube.patch_mpijob(self.namespace, name, patch)
            # Posted with the change itself (a conflicting status patch must not lose it; see above).
            self.kube.post_event(self.body, "Normal", "Suspending" if wanted_suspend else "Resuming",
                                 f"MPIJob {name}: spec.runPolicy.suspend={str(wanted_suspend).lower()}")
        _, progress = self._read(run, training.progress_uri(run), versioned=True)
        current = self.update.desired.get("training") or {}
        uid = mpijob["metadata"].get("uid")
        same_mpijob = current.get("mpiJobUid") in (None, uid)
        merged = training.merge_training_status(current, training.base_training_status(run, name),
                                                training.training_status(progress), same_mpijob)
        merged["mpiJobUid"] = uid
        if not state.finished:
            self._track_interruptions(merged, name, paused=wanted_suspend or state.suspended)
        self.update.desired["training"] = merged
        if not state.finished and self._over_backoff_limit(run, merged):
            self._stop_training(name, state)
            return
        self._input_bound(run, merged.get("inputHistory"))
        uri = training.model_uri(progress)
        if uri:
            self.update.desired["modelUri"] = uri
        if state.state == "Succeeded":
            if (progress or {}).get("state") != "succeeded" and self._within_grace(state.finished_at):
                self._recheck(self._grace_left(state.finished_at))
                self.update.condition(TRAINED, "Unknown", "WaitingForProgress",
                                      f"MPIJob {name} succeeded; waiting for the final {training.progress_uri(run)}")
                self.update.set_phase(Phase.training.value)
                return
            message = training.succeeded_message(name, progress)
            self.update.condition(TRAINED, "True", "Succeeded", message)
            self._pods_done()
            self.update.set_phase(Phase.succeeded.value, message)
        elif state.state == "Failed":
            launcher_log = self._launcher_log(name)
            if launcher_log.tail:
                merged["launcherLogTail"] = launcher_log.tail
            message = training.mpijob_failure_message(self.namespace, name, state, progress, launcher_log,
                                                       self._pod_cause(pod_diagnosis.TRAINING_ROLES, name))
            self.update.condition(TRAINED, "False", MPIJOB_FAILED, message)
            self.update.fail(MPIJOB_FAILED, message)
        elif wanted_suspend:
            self.update.condition(SUSPENDED, "True", "Suspended",
                                  f"MPIJob {name} is suspended (spec.runPolicy.suspend); set it to false to resume "
                                  "from the last checkpoint")
            self.update.condition(TRAINED, "Unknown", "Suspended", training.running_message(name, progress))
            self.update.set_phase(Phase.suspended.value, "spec.runPolicy.suspend is true")
        else:
            if self._condition_true(SUSPENDED):
                self.update.condition(SUSPENDED, "False", "Resumed", f"MPIJob {name} resumed")
            running = training.running_message(name, progress)
            holdup = self._check_pods(pod_diagnosis.TRAINING_ROLES, name)
            self.update.condition(TRAINED, "Unknown", holdup[0] if holdup else "Running",
                                  f"{running}; {holdup[1]}" if holdup else running)
            self.update.set_phase(Phase.training.value, f"MPIJob {name}")

    def _launcher_log(self, mpijob: str) -> pod_diagnosis.LauncherLog:
        """The end of the failed launcher's log, or why it cannot be read (never an error)."""
        found = pod_diagnosis.failed_launcher(self._run_pods(), mpijob)
        if found is None:
            return pod_diagnosis.LauncherLog("", "", "")
        pod, container, node = found
        if not node:
            return pod_diagnosis.LauncherLog(pod, container, "", "it never ran on a node, so it has no log")
        text, error = self.kube.read_pod_log_tail(self.namespace, pod, container, pod_diagnosis.LOG_LINES)
        return pod_diagnosis.LauncherLog(pod, container, pod_diagnosis.log_tail(text or ""), error)

    def _input_bound(self, run: ScalingRun, history) -> None:
        decision = training.input_bound(run, history)
        if decision is None:
            return
        before = get_condition(self.update.desired["conditions"], INPUT_BOUND)
        self.update.condition(INPUT_BOUND, *decision)
        if decision[0] == "True" and (before or {}).get("status") != "True":
            self.update.warn(decision[1], decision[2])

    def _track_interruptions(self, training_status: dict[str, Any], mpijob: str, paused: bool) -> None:
        """Counts worker pods lost and launcher restarts against the pods recorded in status (one Event each)."""
        pods = self._run_pods()
        if paused:  # suspending deletes the pods on purpose
            training_status["pods"] = pod_diagnosis.baseline(pods, mpijob)
            return
        records, interruptions = pod_diagnosis.track_interruptions(
            training_status.get("pods") or [], pods, mpijob, deleted_pod_hints())
        training_status["pods"] = records
        for key in ("restarts", "workerPodsLost", "launcherRestarts"):
            training_status.setdefault(key, 0)
        for interruption in interruptions:
            key = "workerPodsLost" if interruption.role == pod_diagnosis.WORKER else "launcherRestarts"
            training_status[key] += 1
            training_status["restarts"] += 1
            self.update.warn(interruption.reason, interruption.message)

    def _forget_mpijob(self, mpijob: Optional[dict[str, Any]]) -> None:
        """The recorded MPIJob is gone: its pods' losses are part of that, not interruptions of their own."""
        training_status = dict(self.update.desired.get("training") or {})
        records = [{**r, "lost": True} for r in training_status.get("pods") or []]
        training_status["pods"] = records
        training_status["mpiJobUid"] = mpijob["metadata"].get("uid") if mpijob else None
        self.update.desired["training"] = training_status

    def _child_deleted(self, run: ScalingRun, kind: str, name: str, next_step: str, replaced: bool = False) -> bool:
        """Reports and counts a deleted child; True when that was one too many (the run failed)."""
        training_status = dict(self.update.desired.get("training") or {})
        restarts = int(training_status.get("restarts") or 0) + 1
        training_status["restarts"] = restarts
        self.update.desired["training"] = training_status
        limit = run.spec.training.backoff_limit
        how = "was deleted and replaced" if replaced else "was deleted"
        message = (f"{kind} {name} {how} while the run was {self.update.phase}; counted as interruption "
                   f"{restarts} of the {limit} allowed (spec.training.backoffLimit); {next_step}")
        self.update.condition(CHILD_DELETED, "True", f"{kind}Deleted", message)
        self.update.warn("ChildDeleted", message)
        if self._over_backoff_limit(run, training_status, message):
            return True
        self.again = not replaced
        return False

    def _stop_training(self, name: str, state: training.MPIJobState) -> None:
        """A run that failed while its MPIJob still runs: suspend it, so its pods stop holding nodes (and GPUs)."""
        patch = training.suspend_patch(True, state)
        if patch:
            self.kube.patch_mpijob(self.namespace, name, patch)
            self.kube.post_event(self.body, "Normal", "Suspending",
                                 f"MPIJob {name}: suspended because the run failed; delete the run to remove it")

    def _over_backoff_limit(self, run: ScalingRun, training_status: dict[str, Any], last: str = "") -> bool:
        """Fails the run once its interruptions (pods lost, launcher restarts, children deleted) exceed the limit."""
        limit = run.spec.training.backoff_limit
        restarts = int(training_status.get("restarts") or 0)
        if restarts <= limit:
            return False
        last = last or "see the run's Warning Events for each one"
        counted = "1 interruption exceeds" if restarts == 1 else f"{restarts} interruptions exceed"
        message = (f"{counted} spec.training.backoffLimit ({limit}); the last: {last}. "
                   f"Find what deletes or interrupts the run's children and pods (kubectl get events -n "
                   f"{self.namespace}), then recreate the run, which resumes from its last checkpoint when "
                   "spec.training.resume is true, or allow more with spec.training.backoffLimit")
        self.update.fail(BACKOFF_LIMIT_EXCEEDED, message)
        return True

    def _grace_left(self, finished_at) -> float:
        left = self.config.completion_grace_seconds - (self.update.moment - finished_at).total_seconds()
        return max(0.5, min(self.config.recheck_interval_seconds, left + 0.5))

    def _within_grace(self, finished_at) -> bool:
        if finished_at is None:
            return False
        return (self.update.moment - finished_at).total_seconds() < self.config.completion_grace_seconds

    # --- output --------------------------------------------------------------------------------

    def _write(self) -> Optional[str]:
        ready = get_condition(self.update.desired["conditions"], READY)
        message = self._holdup or (ready or {}).get("message")
        if message:
            self.update.desired["message"] = message
        # Events after the status they report: at most once. A restart between the two loses that Event
        # (the status, the source of truth, is kept); posting first would duplicate it on a retry.
        patch = self.update.patch()
        if patch:
            self.kube.patch_run_status(self.namespace, self.name, patch, resource_version=self.resource_version)
        for event in self.update.events:
            self.kube.post_event(self.body, event.type, event.reason, event.message)
            metrics.EVENTS.labels(type=event.type, reason=event.reason).inc()
            log.info("%s/%s: %s %s", self.namespace, self.name, event.reason, event.message)
        return self.update.phase


def _normal(reason: str, message: str) -> Event:
    return Event("Normal", reason, message)


def owner_of(body: dict[str, Any]) -> Optional[str]:
    """The ScalingRun that controls a child (by owner reference; the run label as a fallback)."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith("scalingrun.dev/") and ref.get("controller"):
            return ref.get("name")
    return None

