#!/usr/bin/env python3
"""The test-only MPIJob controller as a Deployment: its objects, rendered for an image and a namespace.

It runs from the operator image (`Dockerfile.operator`: Python with `kubernetes` and `cryptography`),
with controller.py mounted from a ConfigMap, under its own ServiceAccount and a ClusterRole with only
what it uses. Never part of the chart or the images.

    python tests/e2e/mpijob_controller/deploy.py --image IMAGE [--namespace NS] | kubectl apply -f -
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Optional

CONTROLLER_SOURCE = Path(__file__).with_name("controller.py")
NAME = "scalingrun-e2e-mpijob-controller"
MOUNT_DIR = "/opt/mpijob-controller"
HEALTH_PORT = 8081
APP_LABELS = {"app.kubernetes.io/name": "mpijob-controller", "app.kubernetes.io/part-of": "scalingrun-e2e"}

# Least privilege: each verb is one the controller calls (controller.py). Services, ConfigMaps and
# Secrets are read by name and never listed or watched.
RULES: list[dict[str, Any]] = [
    {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs/status"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["services", "configmaps"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "patch", "update"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def manifests(image: str, namespace: str = "default", name: str = NAME,
                    watch_namespace: Optional[str] = None, image_pull_policy: str = "IfNotPresent",
                    controller_source: Path = CONTROLLER_SOURCE) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole(Binding), ConfigMap with controller.py, and the Deployment."""
    source = controller_source.read_text()
    labels = dict(APP_LABELS)
    meta = {"name": name, "namespace": namespace, "labels": labels}
    args = ["python", f"{MOUNT_DIR}/controller.py", f"--health-port={HEALTH_PORT}"]
    if watch_namespace:
        args.append(f"--namespace={watch_namespace}")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role" if watch_namespace else "ClusterRole",
            "metadata": {"name": name, "labels": labels, **({"namespace": watch_namespace} if watch_namespace else {})},
            "rules": RULES}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1",
               "kind": "RoleBinding" if watch_namespace else "ClusterRoleBinding",
               "metadata": dict(role["metadata"]),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"], "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
    probe = {"httpGet": {"path": "/healthz", "port": HEALTH_PORT}, "periodSeconds": 10, "failureThreshold": 3}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two controllers on the same MPIJobs
            "selector": {"matchLabels": labels},
            "template": {
                # A changed controller.py rolls the pod.
                "metadata": {"labels": labels, "annotations": {
                    "scalingrun.dev/controller-sha256": hashlib.sha256(source.encode()).hexdigest()}},
                "spec": {
                    "serviceAccountName": name,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "controller",
                        "image": image,
                        "imagePullPolicy": image_pull_policy,
                        "command": args,
                        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                                {"name": "PYTHONUNBUFFERED", "value": "1"}],
                        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
                        "readinessProbe": probe,
                        # Restarted by no liveness probe while it starts on a busy node (the chart's way too).
                        "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": 60},
                        "livenessProbe": probe,
                        # The node has 2 CPUs for everything; this controller idles on watches. Measured
                        # RSS: 84 MB idle, 86 MB with 5 MPIJobs (the kubernetes client's models are most of it).
                        "resources": {"requests": {"cpu": "25m", "memory": "96Mi"},
                                      "limits": {"cpu": "200m", "memory": "128Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "controller", "mountPath": MOUNT_DIR, "readOnly": True}],
                    }],
                    "volumes": [{"name": "controller", "configMap": {"name": name}}],
                },
            },
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        role,
        binding,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"controller.py": source}},
        deployment,
    ]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True, help="an image with Python, kubernetes and cryptography "
                        "(the operator image)")
    parser.add_argument("--namespace", default="default", help="where the controller runs")
    parser.add_argument("--watch-namespace", default=None,
                        help="only this namespace's MPIJobs, with a Role instead of a ClusterRole")
    parser.add_argument("--image-pull-policy", default="IfNotPresent")
    args = parser.parse_args(argv)
    documents = manifests(args.image, args.namespace, watch_namespace=args.watch_namespace,
                                image_pull_policy=args.image_pull_policy)
    # JSON is YAML; kubectl apply -f - reads a List.
    json.dump({"apiVersion": "v1", "kind": "List", "items": documents}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
