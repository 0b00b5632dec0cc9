"""The cluster quick start's pure parts: the run it applies and the demo store it runs (the whole of it runs in the
e2e's cluster: tests/e2e/test_quickstart_cluster.py)."""

from __future__ import annotations

import kubernetes_validate
import pytest

from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders.common import trainer_image
from scalingrun_operator.demo import seaweedfs
from scalingrun_operator.demo.delivery import split_image
from scalingrun_operator.demo.quickstart import LABELS, SECRET, parse_args, run_document
from scalingrun_api.models import DEFAULT_TRAINER_IMAGE


def test_the_run_is_the_examples_quickstart_on_the_demo_store():
    run = parse_scalingrun(run_document("demo", None, 1, "500m", "2Gi"))
    assert run.metadata.name == "quickstart" and run.metadata.namespace == "demo"
    assert run.spec.storage.endpoint == "http://seaweedfs.demo.svc:8333" == seaweedfs.endpoint("demo")
    assert run.spec.storage.credentials_secret == SECRET
    assert run.spec.workers.replicas == 2 and run.spec.workers.gpus_per_worker == 0
    assert (run.spec.workers.cpu, run.spec.workers.memory, run.spec.training.max_epochs) == ("500m", "2Gi", 1)
    assert trainer_image(run) == DEFAULT_TRAINER_IMAGE  # the default: the name build-images.sh builds
    pushed = parse_scalingrun(run_document("demo", "registry.example.com/ml/trainer:0.1.0-cpu", None, "1", "4Gi"))
    assert trainer_image(pushed) == "registry.example.com/ml/trainer:0.1.0-cpu"
    assert pushed.spec.training.max_epochs == 10  # the example's


def test_the_demo_store_is_a_valid_deployment_said_to_be_for_the_demo():
    objects = seaweedfs.demo_manifests("demo", seaweedfs.IMAGE, SECRET, "key", "secret", LABELS)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert "demo" in deployment["metadata"]["annotations"]["scalingrun.dev/note"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False  # weed reads S3_PORT=tcp://... as a flag otherwise
    assert {"emptyDir": {"sizeLimit": "4Gi"}, "name": "data-root"} in pod["volumes"]
    assert pod["containers"][0]["securityContext"]["runAsNonRoot"] is True
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"} == {SECRET, seaweedfs.IDENTITIES_SECRET}


@pytest.mark.parametrize("image, parts", [("ghcr.io/scalingrun/operator:0.1.0", ("ghcr.io/scalingrun/operator", "0.1.0")),
                                          ("localhost:5000/operator", ("localhost:5000/operator", "")),
                                          ("localhost:5000/operator:1", ("localhost:5000/operator", "1"))])
def test_images_split_into_repository_and_tag(image, parts):
    assert split_image(image) == parts


def test_the_defaults_are_the_readmes():
    args = parse_args([])
    assert (args.namespace, args.per_class, args.worker_cpu, args.down, args.no_build) == \
        ("scalingrun-quickstart", 1000, "1", False, False)
