"""spec.training.strategy: each framework's default, a strategy of another framework refused naming both fields, and
the MPIJob, the local command and the trainer's engine of each strategy."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml

from scalingrun_api.models import FRAMEWORK_STRATEGIES
from scalingrun_operator.schema.crd import build_crd
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from scalingrun_operator.builders import build_children
from scalingrun_operator.builders.config import build_trainer_config, slots_per_worker, total_processes
from scalingrun_operator.local.processes import Commands
from scalingrun_trainer.core.config import ENGINES, engine_of, parse_config
from tests.support.specs import MINIMAL, run_document

ROOT = Path(__file__).resolve().parents[3]


def with_training(**training) -> dict:
    return run_document(training=training)


@pytest.mark.parametrize("framework,strategy", [("keras", "horovod"), ("pytorch-lightning", "ddp")])
def test_an_omitted_strategy_is_the_frameworks_default(framework, strategy):
    run = parse_scalingrun(with_training(framework=framework))
    assert run.spec.training.strategy == strategy
    assert build_trainer_config(run)["training"]["strategy"] == strategy
    assert parse_scalingrun(MINIMAL).spec.training.strategy == "horovod"  # every existing spec keeps its meaning


@pytest.mark.parametrize("framework,strategy", [("keras", "ddp"), ("pytorch-lightning", "horovod"),
                                                ("pytorch-lightning", "multi-worker-mirrored")])
def test_a_strategy_of_another_framework_is_refused_naming_both_fields(framework, strategy):
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(with_training(framework=framework, strategy=strategy))
    (error,) = [e for e in caught.value.errors if e.path == "spec.training.strategy"]
    assert f"{strategy} is not a strategy of spec.training.framework {framework}" in error.message
    assert ", ".join(FRAMEWORK_STRATEGIES[framework]) in error.message


def test_the_crd_lists_the_strategies_without_a_default():
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["training"]["properties"]["strategy"]
    assert field["enum"] == ["horovod", "multi-worker-mirrored", "ddp"]
    assert "default" not in field  # a default there would name one strategy for every framework
    assert "multi-worker-mirrored" in field["description"] and "MultiWorkerMirroredStrategy" in field["description"]


def load(name: str):
    return parse_scalingrun(yaml.safe_load((ROOT / "examples" / name).read_text()))


def test_the_step_5_mirrored_example_is_one_process_on_four_gpus_beside_the_horovod_one():
    mirrored, horovod = load("05b-4gpus-one-node-mirrored.yaml"), load("05-4gpus-one-node.yaml")
    assert (slots_per_worker(mirrored), total_processes(mirrored)) == (1, 1)
    assert (slots_per_worker(horovod), total_processes(horovod)) == (4, 4)
    jobs = {name: build_children(run, "ml")[2] for name, run in (("mirrored", mirrored), ("horovod", horovod))}
    for name, slots in (("mirrored", 1), ("horovod", 4)):
        spec = jobs[name]["spec"]
        assert spec["slotsPerWorker"] == slots
        worker = spec["mpiReplicaSpecs"]["Worker"]
        assert worker["replicas"] == 1
        assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
        script = shlex.split(spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][-1])
        assert script[script.index("-np") + 1] == str(slots)
        assert script[-4:] == ["scalingrun-trainer", "train", "--config", "/etc/scalingrun/config.json"]
    # The mirrored run's image is the Keras one; its config names the strategy.
    assert (jobs["mirrored"]["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"]
            == jobs["horovod"]["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["image"])
    assert build_trainer_config(mirrored)["training"]["strategy"] == "multi-worker-mirrored"


def test_replicas_are_worker_pods_under_multi_worker_mirrored():
    doc = with_training(strategy="multi-worker-mirrored")
    doc["spec"]["workers"] = {"replicas": 3, "gpusPerWorker": 2}
    run = parse_scalingrun(doc)
    assert (slots_per_worker(run), total_processes(run)) == (1, 3)
    assert build_trainer_config(run)["processes"] == 3


def test_the_local_runner_starts_each_engine_as_its_mpijob_would(tmp_path):
    config = tmp_path / "config.json"
    horovod = Commands().train(parse_scalingrun(MINIMAL), 2, config)
    mirrored = Commands().train(parse_scalingrun(with_training(strategy="multi-worker-mirrored")), 2, config)
    assert Path(horovod[0]).name == "horovodrun" and horovod[1:3] == ["-np", "2"]
    assert Path(mirrored[0]).name == "mpirun"
    assert mirrored[mirrored.index("-np") + 1] == "2" and mirrored[mirrored.index("-bind-to") + 1] == "none"
    assert mirrored[-6:] == [sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]
    assert "horovodrun" not in " ".join(mirrored)


@pytest.mark.parametrize("training,module", [
    ({}, "scalingrun_trainer.engines.keras_horovod.train"),
    ({"strategy": "multi-worker-mirrored"}, "scalingrun_trainer.engines.keras_mirrored.train"),
    ({"framework": "pytorch-lightning"}, "scalingrun_trainer.engines.lightning_ddp.train"),
])
def test_the_trainer_picks_the_engine_of_framework_and_strategy(training, module):
    config = build_trainer_config(parse_scalingrun(with_training(**training)))
    assert ENGINES[engine_of(config)] == module
    parsed = parse_config(config)  # the config parses back with the API's models: the spec's defaults, once
    assert parsed.training.early_stopping.patience == 3 and parsed.dataset.seed == 42
    assert parsed.model.weights == "imagenet" and parsed.training.early_stopping.monitor == "val_loss"
