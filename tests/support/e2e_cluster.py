"""The e2e cluster (SCALINGRUN_TEST_KUBECONFIG and the workplace's variables): what is missing, and a connection."""

from __future__ import annotations

import base64
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from tests.support.env import NAMED_KUBECONFIG


# The cluster comes as SCALINGRUN_TEST_KUBECONFIG (tests/conftest.py never lets KUBECONFIG through).
E2E_VARIABLES = ("SCALINGRUN_TEST_KUBECONFIG", "SCALINGRUN_E2E_NAMESPACE", "SCALINGRUN_E2E_S3_ENDPOINT", "SCALINGRUN_E2E_S3_SECRET",
                 "SCALINGRUN_E2E_TRAINER_IMAGE", "SCALINGRUN_E2E_LIGHTNING_IMAGE", "SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE",
                 "SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE", "SCALINGRUN_TOOLS")


@dataclass
class InCluster:
    kubeconfig: str
    namespace: str
    s3_endpoint: str
    s3_secret: str
    trainer_image: str
    lightning_image: str
    custom_model_image: str  # examples/custom-model, built FROM the trainer image
    custom_training_image: str  # examples/custom-training, likewise
    kubectl: list[str]
    api: Any

    def custom(self):
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def get_run(self, name: str) -> dict[str, Any]:
        return self.custom().get_namespaced_custom_object("scalingrun.dev", "v1alpha1", self.namespace,
                                                          "scalingruns", name)

    def create_run(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom().create_namespaced_custom_object("scalingrun.dev", "v1alpha1", self.namespace,
                                                             "scalingruns", body)

    def delete_run(self, name: str, timeout: float = 120) -> None:
        """Deletes a run and waits until its pods are gone (they hold the node's few CPUs)."""
        from kubernetes.client.rest import ApiException

        try:
            self.custom().delete_namespaced_custom_object("scalingrun.dev", "v1alpha1", self.namespace,
                                                          "scalingruns", name, propagation_policy="Foreground")
        except ApiException as exc:
            if exc.status != 404:
                raise
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run_pods(name):
                return
            time.sleep(1)
        pytest.fail(f"pods of {name} still there {timeout:.0f} s after its deletion: {self.run_pods(name)}")

    @contextlib.contextmanager
    def s3(self) -> Iterator[Any]:
        """The run's object store (the e2e's SeaweedFS) as a pyarrow S3FileSystem, with the runs' Secret."""
        from tests.e2e.environment import s3_filesystem

        data = self.core().read_namespaced_secret(self.s3_secret, self.namespace).data
        keys = [base64.b64decode(data[k]).decode() for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
        with s3_filesystem(self.kubectl, self.namespace, *keys) as fs:
            yield fs

    def run_pods(self, name: str) -> list[Any]:
        return self.core().list_namespaced_pod(self.namespace, label_selector=f"scalingrun.dev/run={name}").items

    def events(self, name: str) -> list[Any]:
        return self.core().list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name},involvedObject.kind=ScalingRun").items

    def wait(self, name: str, done: Callable[[dict[str, Any]], bool], timeout: float, what: str,
             each: Optional[Callable[[dict[str, Any]], None]] = None, every: float = 2) -> dict[str, Any]:
        """Polls the run until `done(run)`; `each(run)` sees every read (to record what status went through)."""
        deadline = time.monotonic() + timeout
        run: dict[str, Any] = {}
        while time.monotonic() < deadline:
            run = self.get_run(name)
            if each:
                each(run)
            if done(run):
                return run
            time.sleep(every)
        pods = "\n".join(f"  {p.metadata.name}: {p.status.phase} "
                         f"{[(c.name, c.state.to_dict()) for c in p.status.container_statuses or []]}"
                         for p in self.run_pods(name))
        pytest.fail(f"{name}: not {what} within {timeout:.0f} s; status: {run.get('status')}\npods:\n{pods}")


def missing_variables() -> list[str]:
    return [v for v in E2E_VARIABLES if not os.environ.get(v)]


def connect() -> InCluster:
    """The cluster the exports of `scripts/e2e.sh --keep` name (bench/cpu_limits.py uses it too)."""
    from kubernetes import config

    tools = Path(os.environ["SCALINGRUN_TOOLS"])
    kubeconfig = NAMED_KUBECONFIG
    return InCluster(kubeconfig=kubeconfig, namespace=os.environ["SCALINGRUN_E2E_NAMESPACE"],
                     s3_endpoint=os.environ["SCALINGRUN_E2E_S3_ENDPOINT"],
                     s3_secret=os.environ["SCALINGRUN_E2E_S3_SECRET"],
                     trainer_image=os.environ["SCALINGRUN_E2E_TRAINER_IMAGE"],
                     lightning_image=os.environ["SCALINGRUN_E2E_LIGHTNING_IMAGE"],
                     custom_model_image=os.environ["SCALINGRUN_E2E_CUSTOM_MODEL_IMAGE"],
                     custom_training_image=os.environ["SCALINGRUN_E2E_CUSTOM_TRAINING_IMAGE"],
                     kubectl=[str(tools / "kubectl"), "--kubeconfig", kubeconfig],
                     api=config.new_client_from_config(config_file=kubeconfig))
