"""Session fixtures for the real parts: a Kubernetes API server, SeaweedFS, an MLflow tracking server.

Tests that need a part missing here are skipped on a developer machine, but with CI set (any truthy
value: true, 1, yes...) a missing part fails the test: CI must run them all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# env first: it hides an ambient KUBECONFIG before anything imports kubernetes.
from tests.support.env import NAMED_KUBECONFIG, ROOT, TEST_KUBECONFIG_VARIABLE, require
from tests.support.apiserver import api_server, free_port, install_crd, mpijob_crd_document


# Tests that train under horovodrun or mpirun keep both cores busy. With pytest-xdist (scripts/test.sh runs
# `-n N --dist loadgroup`) their files are dealt, in path order, to SCALINGRUN_TRAINING_LANES lanes (default 2),
# each run by one worker one test after another, beside the workers taking the tests that mostly wait (on an API
# server, an operator, a store). Every other test runs on the worker of its file, with its file's module fixtures.
TRAINING_MARKERS = ("horovod", "lightning", "mirrored")

# Two lanes of two ranks on two cores: oversubscribed, but Open MPI sees only its own 2 ranks on 2 slots and
# busy-polls. An idle Horovod rank burnt 0.3 CPU s a second there, taken from the other lane's ranks; yielding,
# the team script's test took 24.9 CPU s instead of 32.3. Set here for every rank the tests start (mpirun and
# horovodrun pass the environment on); the numbers trained are the same.
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    lanes = max(1, int(os.environ.get("SCALINGRUN_TRAINING_LANES", "2")))
    training_files = sorted({item.location[0] for item in items
                             if any(item.get_closest_marker(marker) for marker in TRAINING_MARKERS)})
    lane_of = {path: f"training-{index % lanes + 1}" for index, path in enumerate(training_files)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(lane_of.get(item.location[0], item.location[0])))


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory) -> str:
    """A kubeconfig for a real API server: the cluster SCALINGRUN_TEST_KUBECONFIG names, else one started
    from KUBEBUILDER_ASSETS. Never KUBECONFIG's."""
    if NAMED_KUBECONFIG:
        require(Path(NAMED_KUBECONFIG).is_file(), f"{TEST_KUBECONFIG_VARIABLE}={NAMED_KUBECONFIG} is not a file")
        yield NAMED_KUBECONFIG
        return
    require(bool(os.environ.get("KUBEBUILDER_ASSETS")),
            f"needs KUBEBUILDER_ASSETS (an API server the tests start) or {TEST_KUBECONFIG_VARIABLE} (a cluster "
            "named for the tests; KUBECONFIG is never used)")
    with api_server(tmp_path_factory.mktemp("cluster"), controllers=True) as path:
        yield path


@pytest.fixture(scope="session")
def kubectl(kubeconfig, tmp_path_factory) -> list[str]:
    """A kubectl command bound to the test cluster, with its own discovery cache: ~/.kube/cache is keyed by
    host:port, and an API server of an earlier session on the same port would leave kubectl a stale one."""
    assets = os.environ.get("KUBEBUILDER_ASSETS", "")
    binary = Path(assets, "kubectl") if assets and Path(assets, "kubectl").exists() else shutil.which("kubectl")
    require(binary is not None, "kubectl not found")
    return [str(binary), "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path_factory.mktemp("kubectl-cache"))]


@pytest.fixture(scope="session")
def api_client(kubeconfig):
    from kubernetes import config

    return config.new_client_from_config(config_file=kubeconfig)


@pytest.fixture(scope="session")
def scalingrun_crd(api_client):
    """The generated CRD, installed once per session (replacing an older one) and established."""
    from scalingrun_operator.schema.crd import build_crd

    return install_crd(api_client, build_crd(), replace=True)


@pytest.fixture(scope="session")
def scalingsweep_crd(api_client, scalingrun_crd):
    """The generated ScalingSweep CRD, installed once per session like the ScalingRun CRD."""
    from scalingrun_operator.schema.crd import build_sweep_crd

    return install_crd(api_client, build_sweep_crd(), replace=True)


@pytest.fixture
def namespace(api_client, request):
    """A fresh namespace per test, deleted afterwards."""
    import uuid

    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"t-{request.node.name[:30].lower().replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real SeaweedFS S3 server on 127.0.0.1 with credentials enforced."""
    import secrets

    from scalingrun_operator.local.s3server import S3Server, weed_binary

    try:
        weed_binary()
    except RuntimeError as exc:
        require(False, str(exc))
    server = S3Server(tmp_path_factory.mktemp("seaweedfs"), "test-" + secrets.token_hex(6), secrets.token_hex(20))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mpijob_crd(api_client):
    """The MPIJob CRD, created through the API: it is too large for client-side apply. Only the CRD: the
    mpi-operator itself does not run, tests play its part."""
    return install_crd(api_client, mpijob_crd_document())


@pytest.fixture(scope="session")
def kopf_peering_crds(api_client) -> list[dict]:
    """kopf's peering CRDs as the chart and manifests/crd ship them."""
    import yaml

    documents = yaml.safe_load_all((ROOT / "manifests/crd/kopf.dev_peerings.yaml").read_text())
    return [install_crd(api_client, crd) for crd in documents if crd]


class MlflowServer:
    """A real MLflow tracking server (mlflow[auth] from its own venv) on 127.0.0.1, basic auth enforced."""

    def __init__(self, folder: Path, binary: Path, username: str, password: str):
        self.folder, self.binary = folder, binary
        self.username, self.password = username, password
        self.uri = f"http://127.0.0.1:{free_port()}"
        self.process: "subprocess.Popen | None" = None

    def env(self) -> dict[str, str]:
        """The variables the trainer reads (in a cluster they come from spec.tracking.credentialsSecret)."""
        return {"MLFLOW_TRACKING_USERNAME": self.username, "MLFLOW_TRACKING_PASSWORD": self.password}

    def start(self, timeout: float = 600) -> None:  # ends at once if the server exits; 600 s: a loaded machine
        import time
        import urllib.request

        config = self.folder / "auth.ini"
        config.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{self.folder}/auth.sqlite\n"
            f"admin_username = {self.username}\nadmin_password = {self.password}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_DISABLE_TELEMETRY": "true",
               "DO_NOT_TRACK": "true", "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex(),
               # MLflow's job runner (7 huey consumers, each importing mlflow): 18 of the start's 25 CPU s; no test
               # submits MLflow jobs
               "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        port = self.uri.rsplit(":", 1)[1]
        self.process = subprocess.Popen(
            [str(self.binary), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", port,
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.sqlite",
             "--artifacts-destination", str(self.folder / "artifacts")],
            stdout=open(self.folder / "server.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        # Ready when an authenticated call to its store answers, not /health alone: the first such call sets up the
        # auth and tracking databases, which took over 120 s on a loaded machine (4 tries of the client's 30 s).
        import base64

        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        ready = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/experiments/search?max_results=1",
                                       headers={"Authorization": f"Basic {token}"})
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(ready, timeout=60):
                    return
            except OSError:
                time.sleep(0.5)
        log = (self.folder / "server.log").read_text(errors="replace")[-3000:]
        self.stop()
        pytest.fail(f"the MLflow server did not start within {timeout:.0f} s:\n{log}", pytrace=False)

    def stop(self) -> None:
        import signal

        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    import secrets

    venv = Path(os.environ.get("SCALINGRUN_MLFLOW_VENV", ROOT / ".venv-mlflow"))
    binary = venv / "bin" / "mlflow"
    require(binary.exists(), f"{binary} not found: scripts/setup.sh installs the MLflow server for the tests")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), binary, "trainer", secrets.token_hex(16))
    server.start()
    try:
        yield server
    finally:
        server.stop()


