"""Tests reach only a cluster named for them (issue #15, item 9).

A user's KUBECONFIG and ~/.kube/config here point at listeners that count connections. The test command
(`scripts/test.sh`) and pytest itself must run the API-server tests against an API server they start,
or against the one SCALINGRUN_TEST_KUBECONFIG names, and never connect to the ambient ones.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests.support.env import ROOT, TEST_KUBECONFIG_VARIABLE, require

pytestmark = pytest.mark.k8s

# One test that needs the CRD, a namespace, the Python client and kubectl in a subprocess.
SELECTION = ["tests/integration/test_crd_apiserver.py::test_kubectl_get_shows_printer_columns"]


class CountingListener:
    """A TCP port that accepts and drops connections, counting them: a cluster nobody named."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self):
        self.sock.close()


def _kubeconfig(path: Path, port: int, name: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": f"https://127.0.0.1:{port}",
                                                "insecure-skip-tls-verify": True}}],
        "users": [{"name": name, "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}))
    return path


@pytest.fixture
def ambient(tmp_path):
    """An environment as a Kubernetes user has it: KUBECONFIG set and a ~/.kube/config, both pointing at
    listeners. The rest of the environment is this session's, without its own API-server settings."""
    in_kubeconfig, in_home = CountingListener(), CountingListener()
    home = tmp_path / "home"
    _kubeconfig(home / ".kube" / "config", in_home.port, "home-cluster")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBEBUILDER_ASSETS", TEST_KUBECONFIG_VARIABLE)}
    env.update(KUBECONFIG=str(_kubeconfig(tmp_path / "user-kubeconfig", in_kubeconfig.port, "users-cluster")),
               HOME=str(home), XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")),
               CI="true", TF_CPP_MIN_LOG_LEVEL="2")
    yield env, (in_kubeconfig, in_home)
    for listener in (in_kubeconfig, in_home):
        listener.close()


def _untouched(listeners) -> None:
    assert [listener.connections for listener in listeners] == [0, 0], "a test connected to a cluster nobody named"


def test_test_command_starts_its_own_api_server_despite_kubeconfig(ambient, tmp_path):
    env, listeners = ambient
    # The envtest builder as test.sh finds it, handing over this session's binaries: test.sh must ask for
    # them although KUBECONFIG is set.
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    require(bool(assets), "needs KUBEBUILDER_ASSETS: the test command starts an API server from them")
    builder = tmp_path / "build-assets.sh"
    builder.write_text(f"#!/usr/bin/env bash\necho {assets}\n")
    builder.chmod(0o755)
    env["SCALINGRUN_ENVTEST_BUILDER"] = str(builder)
    result = subprocess.run(["bash", "scripts/test.sh", *SELECTION, "-p", "no:cacheprovider", "-q"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
    _untouched(listeners)


def test_pytest_without_a_named_cluster_fails_in_ci_saying_what_to_set(ambient):
    env, listeners = ambient
    result = subprocess.run([sys.executable, "-m", "pytest", *SELECTION, "-p", "no:cacheprovider", "-q"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "needs KUBEBUILDER_ASSETS" in result.stdout and TEST_KUBECONFIG_VARIABLE in result.stdout, result.stdout
    _untouched(listeners)


def test_the_opt_in_names_an_existing_cluster(ambient, kubeconfig):
    """SCALINGRUN_TEST_KUBECONFIG: the tests use that cluster (here this session's API server), and no
    API server can be started (no assets, no builder), so only the named one can have served them."""
    env, listeners = ambient
    env.update({TEST_KUBECONFIG_VARIABLE: kubeconfig, "SCALINGRUN_ENVTEST_BUILDER": "/nonexistent/build-assets.sh"})
    result = subprocess.run(["bash", "scripts/test.sh", *SELECTION, "-p", "no:cacheprovider", "-q"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout
    _untouched(listeners)
