"""spec.training.framework: keras (default) or pytorch-lightning; fields that mean nothing for Lightning are refused."""

from __future__ import annotations

import copy
import json

import pytest

from scalingrun_operator.schema.crd import build_crd
from scalingrun_api.models import DEFAULT_LIGHTNING_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGE
from scalingrun_api.models.common import trainer_image_name
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from scalingrun_operator.builders.common import trainer_image
from tests.support.specs import MINIMAL, run_document



def lightning(**sections) -> dict:
    return run_document(**{**sections, "training": {"framework": "pytorch-lightning", **sections.get("training", {})}})


def errors_of(doc: dict) -> list[str]:
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(doc)
    return [str(e) for e in caught.value.errors]


def test_existing_specs_keep_their_meaning():
    run = parse_scalingrun(MINIMAL)
    assert run.spec.training.framework == "keras"
    assert run.spec.workers.gpus_per_worker == 1  # the default asks for a GPU: the Keras GPU image
    assert trainer_image(run) == trainer_image_name("gpu") == "ghcr.io/scalingrun/trainer:0.1.0-gpu"
    assert trainer_image(parse_scalingrun(run_document(workers={"gpusPerWorker": 0}))) == DEFAULT_TRAINER_IMAGE


def test_lightning_gets_its_own_default_image_and_an_explicit_one_wins():
    assert trainer_image(parse_scalingrun(lightning())) == "ghcr.io/scalingrun/trainer:0.1.0-lightning-gpu"
    on_cpu = parse_scalingrun(lightning(workers={"gpusPerWorker": 0}))
    assert trainer_image(on_cpu) == DEFAULT_LIGHTNING_TRAINER_IMAGE
    assert DEFAULT_LIGHTNING_TRAINER_IMAGE.endswith(":0.1.0-lightning-cpu")
    run = parse_scalingrun(lightning(workers={"image": "registry.local/trainer:lt-gpu"}))
    assert trainer_image(run) == "registry.local/trainer:lt-gpu"


def test_unknown_framework_names_the_field_and_the_choices():
    doc = copy.deepcopy(MINIMAL)
    doc["spec"]["training"] = {"framework": "pytorch"}
    messages = errors_of(doc)
    assert any(m.startswith("spec.training.framework: ") and "'keras' or 'pytorch-lightning'" in m
               for m in messages), messages


@pytest.mark.parametrize("base", ["mobilenet_v2", "xception"])
def test_lightning_refuses_keras_only_bases(base):
    messages = errors_of(lightning(model={"base": base}))
    assert any(m.startswith("spec.model.base: ") and base in m and "efficientnet_lite0" in m for m in messages)
    # The same base is fine for Keras.
    doc = lightning(model={"base": base})
    doc["spec"]["training"]["framework"] = "keras"
    assert parse_scalingrun(doc).spec.model.base == base


def test_lightning_refuses_a_keras_weights_file():
    messages = errors_of(lightning(model={"weights": "s3://bucket/weights/base.h5"}))
    assert any(m.startswith("spec.model.weights: ") and "state dict" in m for m in messages), messages
    run = parse_scalingrun(lightning(model={"weights": "s3://bucket/weights/lite0.pth"}))
    assert run.spec.model.weights.endswith(".pth")


def test_crd_has_the_field_with_enum_default_and_explain_text():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    field = spec["training"]["properties"]["framework"]
    assert field["enum"] == ["keras", "pytorch-lightning"]
    assert field["default"] == "keras"
    assert "PyTorch Lightning" in field["description"] and "Horovod" in field["description"]
    assert "default" not in spec["workers"]["properties"]["image"]  # the framework picks it


def test_trainer_in_an_environment_without_the_frameworks_stack_says_which_image(tmp_path, capsys):
    import importlib.util

    from scalingrun_trainer.cli import main as trainer_main

    assert importlib.util.find_spec("torch") is None, "the Keras venv must not have torch"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"training": {"framework": "pytorch-lightning"}}))
    assert trainer_main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "training.framework pytorch-lightning needs" in err and "Lightning trainer image" in err
