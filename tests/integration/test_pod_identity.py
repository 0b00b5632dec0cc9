"""Pod identity against a real API server and a real SeaweedFS: a run with spec.storage.credentials podIdentity names
no Secret; its pods run as spec.workers.serviceAccountName with no key variables, and the operator reads its manifest
and progress with the keys of its own environment, which is where botocore's default chain finds IRSA's and EKS Pod
Identity's (AWS_ROLE_ARN/AWS_WEB_IDENTITY_TOKEN_FILE, AWS_CONTAINER_CREDENTIALS_FULL_URI) as it finds these."""

from __future__ import annotations

import pytest

from tests.support.operator import (  # noqa: F401 (bucket: a fixture)
    Operator, bucket, manifest_for, namespace_cluster, new_run, progress, progress_uri, started, wait_for,
)

pytestmark = pytest.mark.k8s

SERVED = "sri"  # namespaces sri-* are served by this module's operator


@pytest.fixture(scope="module")
def operator(kubeconfig, scalingrun_crd, mpijob_crd, s3_server, tmp_path_factory) -> Operator:
    op = Operator(kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log", [f"{SERVED}-*"], "--standalone",
                  env={"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
                       "SCALINGRUN_POD_IDENTITY_READS": "true"})
    with started(op):
        yield op


@pytest.fixture
def cluster(api_client, s3_server, request, scalingrun_crd, mpijob_crd):
    with namespace_cluster(api_client, s3_server, request, SERVED) as made:
        yield made


def _env_names(pod_spec: dict) -> set[str]:
    return {env["name"] for container in pod_spec["containers"] for env in container.get("env") or []}


def test_a_pod_identity_run_trains_with_no_secret_and_the_operator_reads_with_its_own_identity(
        cluster, operator, bucket, s3_server):
    body = new_run(cluster.ns, "irsa", s3_server, storage={"credentials": "podIdentity"},
                   workers={"serviceAccountName": "training"})
    del body["spec"]["storage"]["credentialsSecret"]
    cluster.create_run(body)
    job = wait_for(lambda: cluster.job("irsa-preprocess"), what="the preprocessing Job", operator=operator)
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "training" and not _env_names(pod) & {"AWS_ACCESS_KEY_ID",
                                                                               "AWS_SECRET_ACCESS_KEY"}
    # The manifest is read with the operator's own keys: nothing else could start training.
    run = cluster.run("irsa")
    bucket.put_json(f"{run['spec']['dataset']['output']}/_manifest.json", manifest_for(run))
    cluster.complete_job("irsa-preprocess", succeeded=2)
    wait_for(cluster.phase_is("irsa", "Training"), what="Training", operator=operator)
    assert cluster.condition("irsa", "StorageReadable").get("status") != "False"
    mpijob = cluster.mpijob("irsa-train")
    for replica in mpijob["spec"]["mpiReplicaSpecs"].values():
        spec = replica["template"]["spec"]
        assert spec["serviceAccountName"] == "training" and "AWS_ACCESS_KEY_ID" not in _env_names(spec)
    bucket.put_json(progress_uri(run), progress("running", 2))
    wait_for(lambda: (cluster.status("irsa").get("training") or {}).get("epoch") == 2, what="epoch 2 from progress",
             operator=operator)
