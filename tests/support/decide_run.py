"""A run's training as decide sees it: its pods, its records, a run brought to training."""

from __future__ import annotations

import copy
from typing import Any, Optional

from tests.support.decide_world import World, config_map, done, job, manifest, mpijob, progress, training_status
from tests.support.decide_pods import pod


RECORDS = [{"name": "demo-train-launcher-aaaaa", "uid": "l-a", "role": "launcher", "restarts": 0, "lost": False},
           {"name": "demo-train-worker-0", "uid": "w0-a", "role": "worker", "restarts": 0, "lost": False},
           {"name": "demo-train-worker-1", "uid": "w1-a", "role": "worker", "restarts": 0, "lost": False}]


def training_pods(launcher_restarts: int = 0, worker1: Optional[dict] = None, launcher: str = "demo-train-launcher-aaaaa",
                  **worker0: Any) -> list[dict]:
    """The launcher and two workers as the MPI operator makes them (their node assigned)."""
    restarted = {"lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}} if launcher_restarts else {}
    pods = [pod(launcher, "launcher", uid="l-a" if launcher.endswith("aaaaa") else "l-b",
                containers=[{"name": "launcher", "restartCount": launcher_restarts, "state": {"running": {}},
                             **restarted}]),
            pod("demo-train-worker-0", "worker", uid="w0-a", **worker0),
            worker1 if worker1 is not None else pod("demo-train-worker-1", "worker", uid="w1-a")]
    for p in pods:
        p["spec"]["nodeName"] = "node-1"
    return pods


def preprocess_pod(**kwargs: Any) -> dict:
    found = pod("demo-preprocess-0-abcde", "preprocess", **kwargs)
    found["spec"]["containers"][0]["resources"] = {"limits": {"memory": "256Mi"}}
    return found


def training(**changes: Any) -> World:
    base: dict[str, Any] = dict(status=training_status(pods=copy.deepcopy(RECORDS)), pods=training_pods(),
                                children={"ConfigMap": config_map(), "Job": job(done("Complete"), succeeded=2),
                                          "MPIJob": mpijob(done("Running"))},
                                manifest=manifest(), progress=progress())
    base.update(changes)
    return World(**base)
