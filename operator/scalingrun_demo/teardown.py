"""`scripts/quickstart.sh --cluster --down`: removes what the quick start added that holds no user data, by its record
on the demo namespace (footprint.py), and says what it leaves and why. Never a CRD: with it would go every ScalingRun
and ScalingSweep in the cluster."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from .delivery import Kube, QuickstartError, say
from .footprint import ADDED, OPERATOR_CRDS, RUN_NAME, demo_namespace


@dataclass(frozen=True)
class Step:
    """One command of `--down`, and what it says before it."""

    says: str
    tool: str  # kubectl or helm
    args: tuple[str, ...]


def down_plan(namespace: str, added: dict[str, Any], others: dict[str, list[str]]) -> tuple[list[Step], list[str]]:
    """What `--down` deletes (only what the quick start made and holds no user data) and what it leaves, with why.
    ADDED: what the demo namespace records; OTHERS: per namespace, the ScalingRuns and ScalingSweeps there that the
    quick start did not make. Never a CRD: deleting one deletes every object of its kind in every namespace."""
    if others.get(namespace):
        raise QuickstartError(f"namespace {namespace} holds {', '.join(others[namespace])}, which the quick start did "
                              "not make: --down would delete them with the namespace. Delete or move them, then run "
                              "--down again")
    steps = [Step(f"deleting namespace {namespace} (the quick start's run, its pods, SeaweedFS and its demo data)",
                  "kubectl", ("delete", "namespace", namespace, "--wait=true", "--timeout=300s"))]
    left = []
    if added.get("release"):
        release, release_namespace = added["release"], added["releaseNamespace"]
        steps.append(Step(f"uninstalling the chart (release {release} in {release_namespace})", "helm",
                          ("uninstall", release, "-n", release_namespace, "--wait", "--timeout", "2m")))
        if added.get("createdNamespace") and others.get(release_namespace):
            left.append(f"namespace {release_namespace}: it holds {', '.join(others[release_namespace])}")
        elif added.get("createdNamespace"):
            steps.append(Step(f"deleting namespace {release_namespace} (the quick start made it for the chart)",
                              "kubectl", ("delete", "namespace", release_namespace, "--ignore-not-found",
                                          "--wait=true", "--timeout=300s")))
        crds = " ".join(added.get("crds") or OPERATOR_CRDS)
        left.append(f"the CRDs ({crds}): deleting a CRD deletes every ScalingRun and ScalingSweep in every "
                    f"namespace, not only the quick start's. When no one needs any: kubectl delete crd {crds}")
    left.append("the images, in Docker (and in the nodes' image caches)")
    return steps, left


def foreign_runs(kube: Kube, namespaces: list[str]) -> dict[str, list[str]]:
    """Per namespace, the ScalingRuns and ScalingSweeps the quick start did not make (kind/name)."""
    if kube.get("crd", OPERATOR_CRDS[0]) is None:
        return {}
    found = {}
    for namespace in namespaces:
        listed = (kube.get("scalingruns,scalingsweeps", "-n", namespace) or {}).get("items", [])
        found[namespace] = [f"{item['kind']}/{item['metadata']['name']}" for item in listed
                            if (item["kind"], item["metadata"]["name"]) != ("ScalingRun", RUN_NAME)]
    return found


def down(args: argparse.Namespace, kube: Kube) -> int:
    found = demo_namespace(kube, args.namespace)
    if found is None:
        say(f"namespace {args.namespace} is not there: nothing to remove")
        return 0
    added = json.loads((found["metadata"].get("annotations") or {}).get(ADDED) or "{}")
    checked = [args.namespace] + ([added["releaseNamespace"]] if added.get("createdNamespace") else [])
    steps, left = down_plan(args.namespace, added, foreign_runs(kube, checked))
    for step in steps:
        say(step.says)
        (kube.kubectl if step.tool == "kubectl" else kube.helm)(*step.args)
    say("removed what the quick start added; left in place:")
    for thing in left:
        say(f"  {thing}")
    return 0
