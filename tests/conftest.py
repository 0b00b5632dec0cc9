"""Session fixtures for the real parts: a Kubernetes API server, SeaweedFS, an MLflow tracking server.

Tests that need a part missing here are skipped on a developer machine, but with CI set (any truthy
value: true, 1, yes...) a missing part fails the test: CI must run them all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]


def in_ci(value: "str | None") -> bool:
    """Any truthy CI (true, 1, yes, a CI system's own word): only unset, empty, 0, false, no or off is not CI.
    scripts/e2e.sh reads CI the same way."""
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


IN_CI = in_ci(os.environ.get("CI"))

# Tests reach only a cluster named for them: their own API server, or SCALINGRUN_TEST_KUBECONFIG (an explicit
# opt-in, like envtest's USE_EXISTING_CLUSTER). An ambient KUBECONFIG, ~/.kube/config or in-cluster account
# is never used: KUBECONFIG points at a file that does not exist, so kubectl, helm and the Python client
# find no cluster unless a test hands one over. Set before anything imports kubernetes (it reads KUBECONFIG
# once, at import).
TEST_KUBECONFIG_VARIABLE = "SCALINGRUN_TEST_KUBECONFIG"
NAMED_KUBECONFIG = os.environ.get(TEST_KUBECONFIG_VARIABLE) or None
NO_CLUSTER = "/nonexistent/scalingrun-tests-name-their-cluster/kubeconfig"
os.environ["KUBECONFIG"] = NO_CLUSTER
for _variable in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
    os.environ.pop(_variable, None)


def require(condition: bool, reason: str) -> None:
    """Skip when a real part is missing, except in CI, where that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{reason}; CI={os.environ.get('CI')} requires it", pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@contextlib.contextmanager
def api_server(state: Path, *, controllers: bool) -> Iterator[str]:
    """A real etcd + kube-apiserver (+ kube-controller-manager) from KUBEBUILDER_ASSETS, stopped afterwards;
    yields its kubeconfig path. The KCM's Job controller runs only with KCM_JOB_CONTROLLER=1 (tests that
    patch Job status by hand need it off)."""
    script = Path(os.environ.get("SCALINGRUN_CLUSTER_SCRIPT", ROOT.parent / "shared/envtest/cluster.sh"))
    require(script.exists(), f"cluster script {script} not found (set SCALINGRUN_CLUSTER_SCRIPT)")
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
    except subprocess.CalledProcessError as exc:
        subprocess.run(["bash", str(script), "stop"], env=env)
        pytest.fail(f"cannot start the API server:\n{exc.stdout}\n{exc.stderr}", pytrace=False)
    try:
        yield str(state / "kubeconfig")
    finally:
        subprocess.run(["bash", str(script), "stop"], env=env, check=False)


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


def mpijob_crd_document() -> dict:
    """The kubeflow MPIJob v2beta1 CRD (mpi-operator v0.8.2)."""
    import yaml

    path = Path(os.environ.get("SCALINGRUN_MPIJOB_CRD", ROOT.parent / "shared/crds/kubeflow.org_mpijobs.yaml"))
    require(path.exists(), f"MPIJob CRD {path} not found (set SCALINGRUN_MPIJOB_CRD)")
    return yaml.safe_load(path.read_text())


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
        self.uri = f"http://127.0.0.1:{_free_port()}"
        self.process: "subprocess.Popen | None" = None

    def env(self) -> dict[str, str]:
        """The variables the trainer reads (in a cluster they come from spec.tracking.credentialsSecret)."""
        return {"MLFLOW_TRACKING_USERNAME": self.username, "MLFLOW_TRACKING_PASSWORD": self.password}

    def start(self, timeout: float = 120) -> None:
        import time
        import urllib.request

        config = self.folder / "auth.ini"
        config.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{self.folder}/auth.sqlite\n"
            f"admin_username = {self.username}\nadmin_password = {self.password}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_DISABLE_TELEMETRY": "true",
               "DO_NOT_TRACK": "true", "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex()}
        port = self.uri.rsplit(":", 1)[1]
        self.process = subprocess.Popen(
            [str(self.binary), "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", port,
             "--workers", "1", "--backend-store-uri", f"sqlite:///{self.folder}/mlflow.sqlite",
             "--artifacts-destination", str(self.folder / "artifacts")],
            stdout=open(self.folder / "server.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
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


def preprocessed_fashion_mnist(s3_server, bucket: str, per_class: int, size: int) -> str:
    """Fashion-MNIST JPEGs uploaded to `bucket`, preprocessed for 2 readers (20 % validation); the Parquet's URI."""
    import sys

    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    s3_server.create_bucket(bucket)
    fs = s3_server.filesystem()
    for relative, data in fashion_mnist_jpegs(per_class):
        with fs.open_output_stream(f"{bucket}/jpeg/{relative}") as stream:
            stream.write(data)
    output = f"s3://{bucket}/parquet"
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", f"s3://{bucket}/jpeg",
         "--output", output, "--image-size", str(size), "--max-readers", "2", "--validation-fraction", "0.2"],
        capture_output=True, text=True, env={**os.environ, **s3_server.env()}, timeout=300)
    assert result.returncode == 0, result.stderr
    return output


def kill_a_rank_after_the_first_checkpoint(job: subprocess.Popen, s3_server, state_at: str, deadline_s: float,
                                           exit_s: float) -> None:
    """Waits for the run's first committed checkpoint (`state_at`, bucket/key), then kills one of the two ranks
    (not mpirun), as a worker pod's loss kills the job, and waits for the job to end."""
    import signal
    import time

    import psutil
    from pyarrow import fs as pafs

    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline and job.poll() is None:
            if s3_server.filesystem().get_file_info(state_at).type == pafs.FileType.File:
                break
            time.sleep(0.2)
        ranks = [p for p in psutil.Process(job.pid).children(recursive=True) if "scalingrun_trainer.cli" in
                 " ".join(p.cmdline())]
        assert len(ranks) == 2, "both ranks should be running after the first checkpoint"
        ranks[-1].kill()
        job.wait(timeout=exit_s)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def saved_keras_model(s3_server, run: str, folder: Path):
    """The Keras run's model.keras (under the run location `run`, s3://...), loaded with plain Keras."""
    import tensorflow as tf

    model_file = folder / "model.keras"
    model_file.write_bytes(s3_server.filesystem().open_input_stream(f"{run}/model/model.keras"[len("s3://"):]).read())
    # compile=False: the file's optimizer may be Horovod's DistributedOptimizer, which plain Keras cannot rebuild.
    return tf.keras.models.load_model(model_file, compile=False)


def assert_saved_keras_model_is_the_whole_network_with_the_best_head(s3_server, run: str, folder: Path, size: int,
                                                                     base_layer: str):
    """The Keras run's saved model is the whole network (uint8 pixels in, the base, probabilities out) with the head
    of the best epoch, as its last checkpoint kept it (best.npz); returns the model."""
    import json

    import numpy as np

    fs = s3_server.filesystem()
    state = json.loads(fs.open_input_stream(f"{run}/checkpoints/state.json"[len("s3://"):]).read())
    assert state["bestWeights"], state
    best_file = folder / "best.npz"
    best_file.write_bytes(fs.open_input_stream(f"{run}/checkpoints/{state['checkpoint']}/best.npz"[len("s3://"):]).read())
    with np.load(best_file) as saved:
        best = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    model = saved_keras_model(s3_server, run, folder)
    assert model.input.dtype == "uint8" and tuple(model.input.shape) == (None, size, size, 3)
    assert model.get_layer("preprocess_input") and model.get_layer(base_layer)
    kernel, bias = model.get_layer("head").get_weights()
    np.testing.assert_array_equal(kernel, best[-2])
    np.testing.assert_array_equal(bias, best[-1])
    pixels = np.random.default_rng(0).integers(0, 256, (4, size, size, 3), dtype=np.uint8)
    np.testing.assert_allclose(model.predict(pixels, verbose=0).sum(axis=1), 1.0, rtol=1e-5)
    return model


def validation_split(s3_server, dataset: str, size: int):
    """The whole validation split of a preprocessed dataset (s3://...) as uint8 pixels and labels, read with pyarrow
    alone."""
    import json

    import numpy as np
    import pyarrow.parquet as pq

    fs, root = s3_server.filesystem(), dataset[len("s3://"):]
    manifest = json.loads(fs.open_input_stream(f"{root}/_manifest.json").read())
    tables = [pq.read_table(fs.open_input_file(f"{root}/{name}"), columns=["image", "label"])
              for name in manifest["files"]["validation"]]
    pixels = np.stack([np.frombuffer(image, np.uint8) for t in tables for image in t.column("image").to_pylist()])
    labels = np.array([label for t in tables for label in t.column("label").to_pylist()])
    return pixels.reshape(-1, size, size, 3), labels


def keras_scores(model, pixels, labels) -> "tuple[float, float]":
    """A saved Keras classifier's mean cross-entropy and accuracy on the given images."""
    import numpy as np
    import tensorflow as tf

    probabilities = model.predict(pixels, verbose=0)
    loss = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities)))
    return loss, float(np.mean(probabilities.argmax(axis=1) == labels))
