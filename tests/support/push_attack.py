"""The attackers of issue 51 item 8 in the e2e cluster, beside a victim run that trains: two small pods of the victim's
namespace (tests/support/push_attacker.py in the trainer image, at ATTACKER_CPU so the 2-CPU node keeps training):
- garbage tokens: a random token each push, at the victim's progress and heartbeat paths;
- a valid token, its own pod's (projected with the status audience, as a run's pod gets it): progress documents for
  MADE_UP_NAMES made-up run names, and for the victim's name progress at FORGED_EPOCH with FORGED_MODEL_URI, and
  heartbeats.
Then: their answers by HTTP status (from their logs), and the operator pods' peak RSS (VmHWM, the kernel's high-water
mark of the process since it started) against their memory limit.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from scalingrun_api.models.common import quantity_value
from scalingrun_api.status_push import CA_FILE, HEARTBEAT, PROGRESS, STATUS_DIR, TOKEN_FILE, URL_FILE, push_path
from scalingrun_operator.builders.common import status_volume
from tests.support.operator import progress

SCRIPT = Path(__file__).with_name("push_attacker.py")
ATTACKER_CPU, ATTACKER_MEMORY = "50m", "128Mi"
MADE_UP_NAMES = 300
FORGED_EPOCH = 99  # past any e2e run's maxEpochs: status showing it would show the attacker's report
FORGED_MODEL_URI = "s3://attacker/stolen/model.keras"
GARBAGE, VALID = "garbage", "valid"
ATTACKER_LABEL = "app.kubernetes.io/component=push-attacker"
MADE_UP, VICTIM_PROGRESS, VICTIM_HEARTBEAT, BAD_TOKEN = "made-up", "victim-progress", "victim-heartbeat", "bad-token"


def plans(namespace: str, victim: str) -> dict[str, dict[str, Any]]:
    """Each attacker's plan (push_attacker.py's argument)."""
    forged = progress("running", FORGED_EPOCH, maxEpochs=FORGED_EPOCH, modelUri=FORGED_MODEL_URI)
    heartbeat = {"phase": "training", "epoch": FORGED_EPOCH, "step": 1, "time": 0, "rank": 0}
    victim_progress = {"paths": [push_path(namespace, victim, PROGRESS)], "body": forged}
    victim_heartbeat = {"paths": [push_path(namespace, victim, HEARTBEAT)], "body": heartbeat}
    made_up = {"paths": [push_path(namespace, f"made-up-{victim}-{i}", PROGRESS) for i in range(MADE_UP_NAMES)],
               "body": progress("running", 1)}
    where = {"dir": STATUS_DIR, "files": {"url": URL_FILE, "ca": CA_FILE, "token": TOKEN_FILE}}
    return {
        GARBAGE: {**where, "token": "garbage", "targets": {
            f"{BAD_TOKEN}-progress": victim_progress, f"{BAD_TOKEN}-heartbeat": victim_heartbeat}},
        VALID: {**where, "token": "own", "targets": {
            MADE_UP: made_up, VICTIM_PROGRESS: victim_progress, VICTIM_HEARTBEAT: victim_heartbeat}},
    }


def attacker_pod(name: str, image: str, plan: dict[str, Any]) -> dict[str, Any]:
    """A pod that runs push_attacker.py with `plan`, mounting what a run's pod pushes with (its own token)."""
    volume, mount = status_volume()
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict([ATTACKER_LABEL.split("=")])},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "attacker", "image": image, "imagePullPolicy": "IfNotPresent",
                                     "command": ["python", "-c", SCRIPT.read_text(), json.dumps(plan)],
                                     "resources": {"requests": {"cpu": "10m", "memory": "64Mi"},
                                                   "limits": {"cpu": ATTACKER_CPU, "memory": ATTACKER_MEMORY}},
                                     "volumeMounts": [mount]}],
                     "volumes": [volume]}}


def start(cluster: Any, victim: str) -> list[str]:
    """Creates the two attacker pods beside run `victim`; their names."""
    bodies = [attacker_pod(f"attacker-{kind}-{victim}", cluster.trainer_image, plan)
              for kind, plan in plans(cluster.namespace, victim).items()]
    for body in bodies:
        cluster.core().create_namespaced_pod(cluster.namespace, body)
    return [body["metadata"]["name"] for body in bodies]


def answers(log: str) -> Counter:
    """The attacker's answers so far, {"<label> <status>": count}, from its last report line."""
    for line in reversed(log.splitlines()):
        if line.startswith("{"):
            return Counter(json.loads(line)["answers"])
    return Counter()


def by_status(counts: Counter) -> Counter:
    """Answers by HTTP status (or error), whatever the label."""
    found: Counter = Counter()
    for key, count in counts.items():
        found[key.rsplit(" ", 1)[1]] += count
    return found


def pod_log(cluster: Any, pod: str) -> str:
    result = subprocess.run([*cluster.kubectl, "logs", "-n", cluster.namespace, pod], capture_output=True, text=True)
    return result.stdout + result.stderr


def peak_rss_mib(proc_status: str) -> float:
    """VmHWM of a /proc/<pid>/status text, in MiB."""
    for line in proc_status.splitlines():
        if line.startswith("VmHWM:"):
            value, unit = line.split()[1:3]
            assert unit == "kB", line
            return int(value) / 1024
    raise ValueError(f"no VmHWM in {proc_status!r}")


def operator_peaks(cluster: Any, namespace: str, selector: str) -> dict[str, tuple[float, float]]:
    """Each running operator pod's peak RSS and memory limit, MiB (its process is the container's first)."""
    found = {}
    for pod in cluster.core().list_namespaced_pod(namespace, label_selector=selector).items:
        if pod.status.phase != "Running" or pod.metadata.deletion_timestamp:
            continue
        status = subprocess.run([*cluster.kubectl, "exec", "-n", namespace, pod.metadata.name, "--", "cat",
                                 "/proc/1/status"], capture_output=True, text=True, check=True).stdout
        limit = quantity_value(pod.spec.containers[0].resources.limits["memory"]) / (1024 * 1024)
        found[pod.metadata.name] = (peak_rss_mib(status), limit)
    return found


class Seen:
    """What the victim's status went through, poll by poll (cluster.wait's `each`)."""

    def __init__(self) -> None:
        self.stalled = False
        self.epochs: set[int] = set()
        self.heartbeat_epochs: set[int] = set()
        self.model_uris: set[str] = set()

    def record(self, run: dict[str, Any]) -> None:
        status = run.get("status") or {}
        training = status.get("training") or {}
        self.stalled |= any(c.get("type") == "Stalled" and c.get("status") == "True"
                            for c in status.get("conditions") or [])
        if training.get("epoch") is not None:
            self.epochs.add(training["epoch"])
        if (training.get("heartbeat") or {}).get("epoch") is not None:
            self.heartbeat_epochs.add(training["heartbeat"]["epoch"])
        if status.get("modelUri"):
            self.model_uris.add(status["modelUri"])


def assert_held(cluster: Any, seen: Seen, run: dict[str, Any], attackers: list[str], operator_namespace: str,
                operator_pods: str) -> None:
    """The victim (Succeeded: `run`) never went Stalled nor showed the attacker's reports; every push of the
    attackers was refused, and they pushed (by status); the operator's peak RSS stayed under half its limit."""
    logs = {pod: pod_log(cluster, pod) for pod in attackers}
    counts = {pod: answers(log) for pod, log in logs.items()}
    peaks = operator_peaks(cluster, operator_namespace, operator_pods)
    print(f"\npush attackers beside {run['metadata']['name']}: "
          + "; ".join(f"{pod}: {dict(sorted(c.items()))}" for pod, c in counts.items())
          + f"; operators' peak RSS / limit (MiB): {peaks}")
    max_epochs = run["spec"]["training"]["maxEpochs"]
    assert not seen.stalled, "the victim went Stalled beside the attackers"
    assert not {k: v for k, v in (run["status"]["training"].get("interruptions") or {}).items() if v}, run["status"]
    assert seen.epochs and max(seen.epochs) <= max_epochs, f"status showed epochs {sorted(seen.epochs)}"
    assert FORGED_EPOCH not in seen.heartbeat_epochs, f"status showed the attacker's heartbeat: {seen.heartbeat_epochs}"
    assert FORGED_MODEL_URI not in seen.model_uris, seen.model_uris
    for pod, found in counts.items():
        statuses = by_status(found)
        assert found, f"{pod} reported no answers:\n{logs[pod][-2000:]}"
        assert "202" not in statuses, f"{pod}: pushes accepted: {dict(found)}"
    valid = next(c for pod, c in counts.items() if f"-{VALID}-" in pod)
    garbage = next(c for pod, c in counts.items() if f"-{GARBAGE}-" in pod)
    assert by_status(garbage).keys() & {"401", "429"}, dict(garbage)
    assert valid[f"{MADE_UP} 404"] > 0, dict(valid)  # a name no run has: refused before any lookup
    # Not its run: 403 by the owner chain, or 401 before it (the attacker's pod lacks the operator's label, which any
    # tenant could set: then the owner chain refuses it)
    for label in (VICTIM_PROGRESS, VICTIM_HEARTBEAT):
        assert valid[f"{label} 403"] + valid[f"{label} 401"] > 0, dict(valid)
    assert peaks and all(peak < limit / 2 for peak, limit in peaks.values()), peaks


def stop(cluster: Any) -> None:
    """Deletes every attacker pod of the namespace (those of a start that failed half-way too)."""
    cluster.core().delete_collection_namespaced_pod(cluster.namespace, label_selector=ATTACKER_LABEL,
                                                    grace_period_seconds=0)
