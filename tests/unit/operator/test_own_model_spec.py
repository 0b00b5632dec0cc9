"""The spec of "your own model": model.builder and params, training.command, dataset.format parquet; each refused
beside the fields it excludes, naming them (validate and the operator share these rules)."""

from __future__ import annotations


import pytest

from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, parse_scalingsweep
from scalingrun_operator.builders.config import build_trainer_config
from scalingrun_operator.schema.sweep import build_point_run, sweep_points
from tests.support.specs import MINIMAL, run_document



spec = run_document


def errors_of(doc: dict) -> dict[str, str]:
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(doc)
    return {e.path: e.message for e in caught.value.errors}


def test_a_builder_alone_gets_no_base_weights_or_head_defaults():
    run = parse_scalingrun(spec(model={"builder": "mypkg.models:build", "params": {"width": 32, "blocks": [1, 2]}}))
    model = run.spec.model
    assert (model.base, model.weights, model.trainable_base, model.dropout) == (None, None, None, None)
    assert model.params == {"width": 32, "blocks": [1, 2]}
    config = build_trainer_config(run)
    assert config["model"]["builder"] == "mypkg.models:build" and config["model"]["params"]["width"] == 32
    assert config["model"]["base"] is None


def test_without_builder_or_command_the_builtin_network_keeps_its_defaults():
    model = parse_scalingrun(MINIMAL).spec.model
    assert (model.base, model.weights, model.trainable_base, model.dropout) == ("efficientnet_lite0", "imagenet",
                                                                                  False, 0.2)


@pytest.mark.parametrize("field,value", [("base", "mobilenet_v2"), ("weights", "none"), ("trainableBase", False),
                                         ("dropout", 0.2)])
def test_builder_and_a_builtin_field_are_refused_naming_both(field, value):
    errors = errors_of(spec(model={"builder": "mypkg.models:build", field: value}))
    assert f"spec.model.{field}" in errors
    assert "spec.model.builder" in errors[f"spec.model.{field}"]


@pytest.mark.parametrize("builder", ["mypkg.models", "mypkg.models:", ":build", "my-pkg.models:build",
                                     "mypkg..models:build", "mypkg.models:build()"])
def test_a_builder_that_is_not_an_import_path_is_refused(builder):
    errors = errors_of(spec(model={"builder": builder}))
    assert "spec.model.builder" in errors and "must be module.path:function" in errors["spec.model.builder"]


def test_params_without_builder_or_command_are_refused():
    errors = errors_of(spec(model={"params": {"width": 32}}))
    assert "builder" in errors["spec.model.params"]


def test_a_command_takes_params_and_a_fixed_batch():
    run = parse_scalingrun(spec(training={"command": ["python", "-m", "mypkg.train", "--fast"],
                                          "batchSizePerWorker": 16}, model={"params": {"depth": 3}}))
    assert run.spec.training.command == ["python", "-m", "mypkg.train", "--fast"]
    assert run.spec.model.base is None and run.spec.model.params == {"depth": 3}
    assert build_trainer_config(run)["training"]["command"][-1] == "--fast"


def test_a_command_refuses_the_model_fields_it_does_not_use_by_name():
    errors = errors_of(spec(training={"command": ["python", "train.py"], "batchSizePerWorker": "auto"},
                            model={"builder": "mypkg.models:build", "base": "xception", "dropout": 0.5}))
    assert {"spec.model.builder", "spec.model.base", "spec.model.dropout",
            "spec.training.batchSizePerWorker"} <= set(errors)
    assert "training.command" in errors["spec.model.base"]


@pytest.mark.parametrize("command,words", [([], "at least 1"), ([""], "at least 1 character"),
                                           ("python train.py", "valid array")])
def test_a_command_must_be_a_list_of_words(command, words):
    errors = errors_of(spec(training={"command": command}))
    assert any(path.startswith("spec.training.command") and words in message for path, message in errors.items()), \
        errors


def test_a_lightning_builder_needs_no_base():
    run = parse_scalingrun(spec(model={"builder": "mypkg.models:build_torch"},
                                training={"framework": "pytorch-lightning"}))
    assert run.spec.model.builder == "mypkg.models:build_torch"


def test_parquet_takes_column_names_and_refuses_preprocessing_settings():
    run = parse_scalingrun(spec(dataset={"format": "parquet", "columns": {"image": "pixels", "label": "y"}}))
    assert (run.spec.dataset.format, run.spec.dataset.columns.image, run.spec.dataset.columns.label) == (
        "parquet", "pixels", "y")
    assert parse_scalingrun(MINIMAL).spec.dataset.format == "jpeg-tree"
    errors = errors_of(spec(dataset={"format": "parquet", "validationFraction": 0.2,
                                     "preprocessing": {"parallelism": 8}}))
    assert {"spec.dataset.validationFraction", "spec.dataset.preprocessing.parallelism"} <= set(errors)
    assert "parquet" in errors["spec.dataset.validationFraction"]


def test_columns_are_refused_with_a_jpeg_tree_and_must_be_field_names():
    assert "spec.dataset.columns.label" in errors_of(spec(dataset={"columns": {"label": "y"}}))
    errors = errors_of(spec(dataset={"format": "parquet", "columns": {"image": "image bytes"}}))
    assert "pattern" in errors["spec.dataset.columns.image"]


def test_a_sweep_of_a_builder_run_keeps_the_builder_in_every_point():
    sweep = parse_scalingsweep({
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep", "metadata": {"name": "own"},
        "spec": {"workers": [1, 2], "template": {**MINIMAL["spec"], "model": {"builder": "mypkg.models:build",
                                                                               "params": {"width": 8}}}}})
    for point in sweep_points(sweep):
        child = parse_scalingrun(build_point_run(sweep, point))
        assert child.spec.model.builder == "mypkg.models:build" and child.spec.model.base is None
        assert child.spec.model.params == {"width": 8}


def test_a_sweep_template_with_builder_and_base_is_refused_at_the_template_path():
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingsweep({
            "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep", "metadata": {"name": "own"},
            "spec": {"workers": [1, 2], "template": {**MINIMAL["spec"], "model": {"builder": "mypkg.models:build",
                                                                                   "base": "xception"}}}})
    assert "spec.template.model.base" in {e.path for e in caught.value.errors}
