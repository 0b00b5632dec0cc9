"""A real etcd + kube-apiserver from KUBEBUILDER_ASSETS, and CRDs installed into it (established and served)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from .env import ROOT, require


# Below the kernel's ephemeral range (32768-60999 by default) and SeaweedFS's (local/s3server.py: 20000-38999): a
# port the kernel handed out by bind(0) is also any outgoing connection's next source port, which took a test
# server's port before it bound it in a CI run at load 70.
SERVER_PORTS = range(12000, 20000)


def free_port() -> int:
    """A port free on 127.0.0.1 now (for a server a test starts), from SERVER_PORTS in a random order."""
    for port in random.sample(SERVER_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {SERVER_PORTS} on 127.0.0.1")


def _api_server_ports() -> dict[str, str]:
    """Distinct free ports for one API server, held together while chosen, with etcd's peer port free too
    (cluster.sh puts it at ETCD_PORT + 1: a taken one failed etcd's start in a CI run)."""
    while True:
        with contextlib.ExitStack() as stack:
            ports = []
            for _ in range(3):
                sock = stack.enter_context(socket.socket())
                sock.bind(("127.0.0.1", 0))
                ports.append(sock.getsockname()[1])
            peer = stack.enter_context(socket.socket())
            try:
                peer.bind(("127.0.0.1", ports[1] + 1))
            except OSError:
                continue
            return {"APISERVER_PORT": str(ports[0]), "ETCD_PORT": str(ports[1]), "KCM_PORT": str(ports[2])}


def _logs(state: Path) -> str:
    """The ends of the logs the cluster script leaves (etcd's and the API server's say which port was taken)."""
    return "".join(path.read_text(errors="replace")[-2000:] for path in sorted((state / "logs").glob("*.log")))


@contextlib.contextmanager
def api_server(state: Path, *, controllers: bool) -> Iterator[str]:
    """A real etcd + kube-apiserver (+ kube-controller-manager) from KUBEBUILDER_ASSETS, stopped afterwards;
    yields its kubeconfig path. The KCM's Job controller runs only with KCM_JOB_CONTROLLER=1 (tests that
    patch Job status by hand need it off)."""
    script = Path(os.environ.get("SCALINGRUN_CLUSTER_SCRIPT", ROOT.parent / "shared/envtest/cluster.sh"))
    require(script.exists(), f"cluster script {script} not found (set SCALINGRUN_CLUSTER_SCRIPT)")
    # Ports are free when chosen, not held: another process (pytest-xdist starts one API server per worker) can take
    # one before etcd or the API server binds it. Such a start is tried again on other ports.
    for attempt in range(3):
        env = {
            **os.environ,
            "K8S_BIN": os.environ["KUBEBUILDER_ASSETS"],
            "STATE": str(state),
            **_api_server_ports(),
            "WITH_KCM": "1" if controllers else "0",
            "KCM_JOB_CONTROLLER": os.environ.get("KCM_JOB_CONTROLLER", "0"),
        }
        try:
            subprocess.run(["bash", str(script), "start"], env=env, check=True, capture_output=True, text=True)
            break
        except subprocess.CalledProcessError as exc:
            subprocess.run(["bash", str(script), "stop"], env=env, capture_output=True)
            shutil.rmtree(state / "etcd", ignore_errors=True)  # the next etcd starts with its own peer address
            if attempt == 2 or "address already in use" not in f"{exc.stdout}{exc.stderr}{_logs(state)}":
                pytest.fail(f"cannot start the API server:\n{exc.stdout}\n{exc.stderr}", pytrace=False)
    try:
        yield str(state / "kubeconfig")
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, check=False)


@contextlib.contextmanager
def kubectl_environment(state: Path) -> Iterator[str]:
    """An API server of its own, named by KUBECONFIG, with scripts/tools.sh's kubectl and helm first on PATH, for code
    of this process that shells out to them (the quick start's Kube); both variables restored afterwards."""
    require(bool(os.environ.get("KUBEBUILDER_ASSETS")), "needs KUBEBUILDER_ASSETS (an API server of its own)")
    tools = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    require(tools.returncode == 0, f"kubectl not available: {tools.stderr[-500:]}")
    with api_server(state, controllers=False) as kubeconfig:
        saved = {k: os.environ.get(k) for k in ("KUBECONFIG", "PATH")}
        os.environ["KUBECONFIG"] = kubeconfig
        os.environ["PATH"] = f"{tools.stdout.strip()}:{os.environ['PATH']}"
        try:
            yield kubeconfig
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


# The CRDs this session created (on a named cluster, the only ones a test may delete and then put back).
CREATED_CRDS: dict[str, dict] = {}


def install_crd(api_client, crd: dict, *, replace: bool = False) -> dict:
    """Creates a CRD (or, with replace, updates an existing one) and waits until it is established."""
    import time

    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    name = crd["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(crd)
        CREATED_CRDS[name] = crd
    except ApiException as exc:
        if exc.status != 409:
            raise
        if replace:
            if name in CREATED_CRDS:
                CREATED_CRDS[name] = crd
            crd = {**crd, "metadata": {**crd["metadata"],
                                       "resourceVersion": ext.read_custom_resource_definition(name).metadata.resource_version}}
            ext.replace_custom_resource_definition(name, crd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = ext.read_custom_resource_definition(name).status
        if any(c.type == "Established" and c.status == "True" for c in (status.conditions or [])) and _discovered(
                api_client, crd):
            return crd
        time.sleep(0.2)
    pytest.fail(f"CRD {name} not established and served by discovery within 30 s")


def _discovered(api_client, crd: dict) -> bool:
    """Whether discovery lists the CRD's resource in each served version: Established can come first (the API
    server's discovery controller syncs on its own), and kubectl finds `ssweep` and the like only through discovery."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served", True)):
        try:
            resources = client.CustomObjectsApi(api_client).get_api_resources(group, version).resources
        except ApiException:
            return False
        if plural not in {r.name for r in resources}:
            return False
    return True


def mpijob_crd_document() -> dict:
    """The kubeflow MPIJob v2beta1 CRD (mpi-operator v0.8.2)."""
    import yaml

    path = Path(os.environ.get("SCALINGRUN_MPIJOB_CRD", ROOT.parent / "shared/crds/kubeflow.org_mpijobs.yaml"))
    require(path.exists(), f"MPIJob CRD {path} not found (set SCALINGRUN_MPIJOB_CRD)")
    return yaml.safe_load(path.read_text())


def kueue_crd_document(plural: str, kind: str, scope: str) -> dict:
    """One of Kueue's CRDs (kueue.x-k8s.io/v1beta1), its schema left open: what discovery and doctor look at."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"},
            "spec": {"group": "kueue.x-k8s.io", "scope": scope, "names": {"kind": kind, "plural": plural},
                     "versions": [{"name": "v1beta1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
