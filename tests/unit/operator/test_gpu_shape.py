"""A run that asks for GPUs, rendered: the engine's GPU image, /dev/shm sized in memory, the GPU pools' taints
tolerated, NCCL's errors ending the ranks within the run's stall settings, the device plugin's resource; and the
warning, from validate and as the operator's Event, about an image named as a CPU build beside a GPU request."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from scalingrun_api.engines import ENGINES, cpu_flavour_of, image_tag
from scalingrun_operator.builders import build_children
from scalingrun_operator.cli import main
from scalingrun_operator.cluster.reconcile import settings_of
from scalingrun_operator.config import ConfigError, load
from scalingrun_operator.decide.snapshot import Settings
from scalingrun_operator.local.processes import gpus_here
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun, spec_warnings
from scalingrun_operator.schema.workers import CPU_IMAGE_WITH_GPUS
from tests.support.decide_world import SPEC, World, actions, manifest
from tests.support.env import require
from tests.support.specs import run_document

ROOT = Path(__file__).resolve().parents[3]
MPIJOB_CRD = ROOT.parent / "shared/crds/kubeflow.org_mpijobs.yaml"
GPU_POOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
AKS_GPU_POOL = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
ENGINE_SPECS = {  # (framework, strategy) -> the image flavours without and with GPUs
    ("keras", "horovod"): ("cpu", "gpu"),
    ("keras", "multi-worker-mirrored"): ("cpu", "gpu"),
    ("pytorch-lightning", "ddp"): ("lightning-cpu", "lightning-gpu"),
}


def _run(training: dict | None = None, **workers):
    return parse_scalingrun(run_document(workers=workers, training=training or {}))


def _replicas(run, **kwargs) -> dict[str, dict]:
    """Launcher and Worker pod specs of the rendered MPIJob."""
    mpijob = build_children(run, "ml", **kwargs)[2]
    return {role: spec["template"]["spec"] for role, spec in mpijob["spec"]["mpiReplicaSpecs"].items()}


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}


@pytest.fixture(scope="module")
def mpijob_schema():
    require(MPIJOB_CRD.exists(), f"{MPIJOB_CRD} not found")
    crd = yaml.safe_load(MPIJOB_CRD.read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")["schema"]["openAPIV3Schema"]


# --- the image follows the devices ---------------------------------------------------------------------------------


@pytest.mark.parametrize("framework, strategy", sorted(ENGINE_SPECS))
@pytest.mark.parametrize("gpus", [0, 1, 4])
def test_the_default_image_is_the_engines_flavour_for_the_devices(framework, strategy, gpus):
    run = _run({"framework": framework, "strategy": strategy}, gpusPerWorker=gpus)
    config_map, job, mpijob = build_children(run, "ml")
    flavour = ENGINE_SPECS[(framework, strategy)][gpus > 0]
    pods = [job["spec"]["template"]["spec"], *(r["template"]["spec"] for r in mpijob["spec"]["mpiReplicaSpecs"].values())]
    assert {pod["containers"][0]["image"] for pod in pods} == {f"ghcr.io/scalingrun/trainer:0.1.0-{flavour}"}
    assert json.loads(config_map["data"]["config.json"])["image"] == f"ghcr.io/scalingrun/trainer:0.1.0-{flavour}"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_gpu_example_renders_a_gpu_image_and_the_quick_starts_a_cpu_one(example):
    document = yaml.safe_load(example.read_text())
    if document["kind"] != "ScalingRun":
        return
    gpus = (document["spec"].get("workers") or {}).get("gpusPerWorker")
    if example.name.startswith("quickstart"):
        assert gpus == 0, "a quick start asks for no GPU, explicitly"
    images = {pod["containers"][0]["image"] for pod in _replicas(parse_scalingrun(document)).values()}
    assert len(images) == 1
    (image,) = images
    assert (cpu_flavour_of(image) is None) == (gpus != 0), image
    assert image_tag(image).endswith("-gpu") == (gpus != 0), image


def test_our_scheme_reads_a_cpu_flavour_only_in_the_tag():
    cpu = ["ghcr.io/scalingrun/trainer:0.1.0-cpu", "registry.local:5000/ml/trainer:7.1-lightning-cpu", "trainer:cpu",
           "mirror/trainer:lightning-cpu@sha256:" + "a" * 64]
    other = ["ghcr.io/scalingrun/trainer:0.1.0-gpu", "registry.local:5000/cpu", "team/cpu-trainer:1", "team/trainer",
             "team/trainer@sha256:" + "b" * 64, "registry.local:5000/trainer:0.1.0-lightning-gpu", "team/t:cpus"]
    assert [cpu_flavour_of(i) for i in cpu] == ["cpu", "lightning-cpu", "cpu", "lightning-cpu"]
    assert [cpu_flavour_of(i) for i in other] == [None] * len(other)
    assert {row.cpu_flavour for row in ENGINES.values()} == {"cpu", "lightning-cpu"}


def test_a_local_run_names_the_cpu_image_unless_the_machine_has_gpus(tmp_path):
    driver = tmp_path / "gpus"
    assert gpus_here({}, str(driver)) == 0  # no NVIDIA driver loaded
    driver.mkdir()
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (driver / bus).mkdir()
    assert gpus_here({}, str(driver)) == 2
    assert gpus_here({"CUDA_VISIBLE_DEVICES": ""}, str(driver)) == 0
    assert gpus_here({"CUDA_VISIBLE_DEVICES": "-1"}, str(driver)) == 0
    assert gpus_here({"CUDA_VISIBLE_DEVICES": "1"}, str(driver)) == 2  # the driver's count; CUDA picks among them
    # The local runner decides with gpu_images=False on such a machine: the run's config names the CPU image.
    world = World(pinned=False, spec={**copy.deepcopy(SPEC), "workers": {"replicas": 2, "gpusPerWorker": 1}})
    created = {a.obj["kind"]: a.obj for a in world.decide(Settings(gpu_images=False)).actions}
    assert json.loads(created["ConfigMap"]["data"]["config.json"])["image"] == "ghcr.io/scalingrun/trainer:0.1.0-cpu"
    created = {a.obj["kind"]: a.obj for a in world.decide(Settings()).actions}
    assert json.loads(created["ConfigMap"]["data"]["config.json"])["image"] == "ghcr.io/scalingrun/trainer:0.1.0-gpu"


# --- a CPU image beside a GPU request: a warning, from validate and from the operator ----------------------------


def _cpu_image_run(gpus: int = 2, image: str = "registry.local/ml/trainer:0.1.0-cpu", **training) -> dict:
    return run_document(workers={"gpusPerWorker": gpus, "image": image}, training=training)


def test_validate_warns_about_a_cpu_image_beside_a_gpu_request_and_still_calls_the_run_valid(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cpu_image_run()))
    assert main(["validate", "-f", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "is valid" in out
    assert err.count("warning:") == 1
    for words in ("spec.workers.image: registry.local/ml/trainer:0.1.0-cpu is a CPU build", "gpusPerWorker is 2",
                  "Use registry.local/ml/trainer:0.1.0-gpu", "gpusPerWorker: 0"):
        assert words in err
    lightning = _cpu_image_run(image="registry.local/ml/trainer:0.1.0-cpu", framework="pytorch-lightning")
    (warning,) = spec_warnings(parse_scalingrun(lightning))
    assert "Use registry.local/ml/trainer:0.1.0-lightning-gpu" in warning.message  # the engine's GPU flavour


@pytest.mark.parametrize("gpus, image", [(0, "registry.local/ml/trainer:0.1.0-cpu"),  # CPU on purpose
                                         (1, "registry.local/ml/trainer:0.1.0-gpu"),
                                         (1, "team/own-trainer:2024.1"),  # outside our scheme: not judged
                                         (1, None)])  # ours: the GPU image
def test_no_warning_where_the_image_fits_the_devices_or_is_not_ours_to_judge(gpus, image, tmp_path, capsys):
    document = run_document(workers={"gpusPerWorker": gpus, **({"image": image} if image else {})})
    assert spec_warnings(parse_scalingrun(document)) == []
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(document))
    assert main(["validate", "-f", str(path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_validate_warns_for_a_sweep_whose_points_ask_for_gpus_in_a_cpu_image(tmp_path, capsys):
    sweep = yaml.safe_load((ROOT / "examples/sweep.yaml").read_text())
    sweep["spec"]["template"]["workers"]["image"] = "registry.local/ml/trainer:0.1.0-cpu"
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert main(["validate", "-f", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: spec.template.workers.image: registry.local/ml/trainer:0.1.0-cpu") == 1


def test_the_operator_posts_the_same_warning_once_when_the_run_starts():
    spec = {**copy.deepcopy(SPEC), "workers": {"replicas": 2, "gpusPerWorker": 1,
                                              "image": "registry.local/ml/trainer:0.1.0-cpu"}}
    world = World(pinned=False, spec=spec)
    first = world.decide()
    (event,) = [e for e in first.events if e.reason == CPU_IMAGE_WITH_GPUS]
    run = parse_scalingrun({"apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingRun",
                            "metadata": {"name": "demo"}, "spec": spec})
    assert event.type == "Warning" and event.message == str(spec_warnings(run)[0])
    # The next look finds the run pinned: no second Event.
    world.status, world.pinned = copy.deepcopy(dict(first.desired)), True
    world.children = {a.obj["kind"]: a.obj for a in first.actions}
    assert not [e for e in world.decide().events if e.reason == CPU_IMAGE_WITH_GPUS]


# --- pods shaped for GPUs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers, size", [({}, "1Gi"), ({"memory": "32Gi"}, "1Gi"), ({"memory": "2Gi"}, "1Gi"),
                                           ({"memory": "1Gi"}, "512Mi"), ({"memory": "1536Mi"}, "768Mi"),
                                           ({"memory": "32Gi", "sharedMemory": "8Gi"}, "8Gi"),
                                           ({"gpusPerWorker": 0, "sharedMemory": "256Mi"}, "256Mi")])
def test_workers_get_a_memory_backed_dev_shm_of_the_asked_size(workers, size, mpijob_schema):
    run = _run(**workers)
    replicas = _replicas(run)
    worker = replicas["Worker"]
    volumes = {v["name"]: v for v in worker["volumes"]}
    (mount,) = [m for m in worker["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert volumes[mount["name"]] == {"name": mount["name"], "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert "readOnly" not in mount
    # The launcher only runs mpirun (rank 0 trains on a worker): no /dev/shm of its own.
    launcher = replicas["Launcher"]
    assert all(m["mountPath"] != "/dev/shm" for m in launcher["containers"][0]["volumeMounts"])
    assert all(v.get("emptyDir", {}).get("medium") != "Memory" for v in launcher["volumes"])
    jsonschema.validate(build_children(run, "ml")[2], mpijob_schema)


def test_a_shared_memory_as_large_as_the_memory_limit_is_refused():
    with pytest.raises(InvalidScalingRun) as caught:
        _run(memory="4Gi", sharedMemory="4Gi")
    assert [str(e) for e in caught.value.errors] == [
        "spec.workers.sharedMemory: must be below spec.workers.memory (4Gi), got 4Gi: what /dev/shm holds counts "
        "against the worker's memory limit"]
    with pytest.raises(InvalidScalingRun, match="spec.workers.sharedMemory: must be a positive quantity"):
        _run(sharedMemory="lots")


def test_gpu_workers_tolerate_the_gpu_pools_taints_and_cpu_workers_do_not():
    lost_node = {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}
    gpu = _replicas(_run(gpusPerWorker=2))
    assert [t for t in gpu["Worker"]["tolerations"] if t["key"] not in lost_node] == [GPU_POOL, AKS_GPU_POOL]
    assert {t["key"] for t in gpu["Launcher"]["tolerations"]} == lost_node  # the launcher has no GPU
    cpu = _replicas(_run(gpusPerWorker=0))
    assert {t["key"] for t in cpu["Worker"]["tolerations"]} == lost_node


@pytest.mark.parametrize("own, added", [
    ([GPU_POOL], [AKS_GPU_POOL]),                                            # the same one: kept once, the user's
    ([{"key": "nvidia.com/gpu", "operator": "Exists"}], [AKS_GPU_POOL]),     # every effect of that taint
    ([{"operator": "Exists"}], []),                                          # every taint
    ([{"key": "sku", "operator": "Exists", "effect": "NoSchedule"}], [GPU_POOL]),
    ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
     [GPU_POOL, AKS_GPU_POOL]),                                              # one value of it only: ours too
])
def test_the_operators_gpu_tolerations_are_added_only_where_the_runs_own_do_not_cover_them(own, added):
    worker = _replicas(_run(gpusPerWorker=1, tolerations=own))["Worker"]
    assert [t for t in worker["tolerations"] if t.get("effect") != "NoExecute"] == [
        t for t in own if t.get("effect") != "NoExecute"] + added


def test_the_gpu_tolerations_come_from_the_operators_setting_which_the_chart_value_sets():
    amd = [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    settings = settings_of(load({"SCALINGRUN_GPU_TOLERATIONS": json.dumps(amd)}))
    worker = _replicas(_run(gpusPerWorker=1), gpu_tolerations=settings.gpu_tolerations)["Worker"]
    assert [t for t in worker["tolerations"] if t["effect"] == "NoSchedule"] == amd
    none = settings_of(load({"SCALINGRUN_GPU_TOLERATIONS": "[]"}))
    worker = _replicas(_run(gpusPerWorker=1), gpu_tolerations=none.gpu_tolerations)["Worker"]
    assert [t for t in worker["tolerations"] if t["effect"] == "NoSchedule"] == []
    assert [t.model_dump(mode="json", exclude_none=True) for t in load({}).gpu_tolerations] == [GPU_POOL, AKS_GPU_POOL]
    for bad in ("nvidia.com/gpu", '[{"key": "x", "operator": "Sometimes"}]', '{"key": "x"}'):
        with pytest.raises(ConfigError, match="SCALINGRUN_GPU_TOLERATIONS is not a JSON list of tolerations"):
            load({"SCALINGRUN_GPU_TOLERATIONS": bad})


def test_the_operator_renders_the_mpijob_with_its_settings_tolerations():
    amd = settings_of(load({"SCALINGRUN_GPU_TOLERATIONS": '[{"key": "amd.com/gpu", "operator": "Exists"}]'}))
    spec = {**copy.deepcopy(SPEC), "workers": {"replicas": 2, "gpusPerWorker": 1}}
    decision = World(pinned=False, spec=spec, manifest=manifest()).decide(amd)  # the dataset is there: training
    assert ("create", "MPIJob") in actions(decision)
    mpijob = next(a.obj for a in decision.actions if a.obj["kind"] == "MPIJob")
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {"key": "amd.com/gpu", "operator": "Exists"} in worker["tolerations"]
    assert GPU_POOL not in worker["tolerations"]


@pytest.mark.parametrize("stall_timeout, seconds", [("auto", "300"), (0, "0"), ("0s", "0"), ("10m", "300"),
                                                    ("1h", "300"), (240, "120"), ("2m", "60"), (15, "10")])
def test_gpu_ranks_get_nccl_error_handling_and_a_collective_timeout_from_the_stall_timeout(stall_timeout, seconds):
    replicas = _replicas(_run({"stallTimeout": stall_timeout}, gpusPerWorker=2))
    for role, pod in replicas.items():
        env = _env(pod)
        assert env["NCCL_ASYNC_ERROR_HANDLING"] == env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1", role
        assert env["SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS"] == seconds, role
    # Rank 0 runs on a worker, started by the launcher's mpirun: the variables travel with -x.
    argv = shlex.split(replicas["Launcher"]["containers"][0]["command"][-1])
    forwarded = {argv[i + 1] for i, word in enumerate(argv) if word == "-x"}
    assert {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS"} <= forwarded


def test_cpu_ranks_keep_the_trainers_own_collective_timeout_and_no_nccl_settings():
    for pod in _replicas(_run({"stallTimeout": "2m"}, gpusPerWorker=0)).values():
        env = _env(pod)
        assert not {"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                    "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS"} & set(env)


@pytest.mark.parametrize("resource", [None, "nvidia.com/mig-3g.40gb", "amd.com/gpu", "gpu.intel.com/i915"])
def test_the_gpu_resource_is_the_runs_or_nvidias(resource, mpijob_schema):
    gpus = 1 if resource and resource.startswith("nvidia.com/mig-") else 2  # one MIG slice a worker
    run = _run(gpusPerWorker=gpus, cpu="8", memory="32Gi", **({"gpuResource": resource} if resource else {}))
    worker = _replicas(run)["Worker"]["containers"][0]["resources"]
    assert worker["limits"] == {"cpu": "8", "memory": "32Gi", resource or "nvidia.com/gpu": gpus}
    assert worker["requests"] == {"cpu": "8", "memory": "32Gi"}  # the API server sets a GPU's request to its limit
    jsonschema.validate(build_children(run, "ml")[2], mpijob_schema)
    assert "gpu" not in json.dumps(_replicas(_run(gpusPerWorker=0, gpuResource="amd.com/gpu"))["Worker"]["containers"][0]
                                  ["resources"])


@pytest.mark.parametrize("resource, words", [
    ("gpu", "spec.workers.gpuResource: string should match pattern"),
    ("nvidia.com/", "spec.workers.gpuResource: string should match pattern"),
    ("NVIDIA.com/gpu", "spec.workers.gpuResource: string should match pattern"),
    ("kubernetes.io/gpu", "spec.workers.gpuResource: kubernetes.io/gpu is not an extended resource"),
    ("devices.kubernetes.io/gpu", "spec.workers.gpuResource: devices.kubernetes.io/gpu is not an extended resource"),
    ("requests.nvidia.com/gpu", "spec.workers.gpuResource: requests.nvidia.com/gpu is not an extended resource"),
])
def test_a_gpu_resource_that_is_no_extended_resource_is_refused(resource, words):
    with pytest.raises(InvalidScalingRun) as caught:
        _run(gpuResource=resource)
    assert any(str(e).lower().startswith(words.lower()) for e in caught.value.errors), caught.value.errors


# --- MIG: one slice a process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [2, 4])
def test_several_gpus_a_worker_of_a_mig_slice_are_refused_saying_what_to_ask_for(gpus):
    with pytest.raises(InvalidScalingRun) as caught:
        parse_scalingrun(run_document(workers={"gpusPerWorker": gpus, "gpuResource": "nvidia.com/mig-3g.40gb"}))
    [error] = [str(e) for e in caught.value.errors]
    assert error.startswith("spec.workers.gpusPerWorker: must be 1 with a MIG slice (nvidia.com/mig-3g.40gb)")
    assert f"got {gpus}" in error and "spec.workers.replicas" in error


@pytest.mark.parametrize("workers", [{"gpusPerWorker": 1, "gpuResource": "nvidia.com/mig-1g.10gb"},
                                     {"gpusPerWorker": 4, "gpuResource": "nvidia.com/gpu"}, {"gpusPerWorker": 4}])
def test_one_mig_slice_a_worker_and_several_whole_gpus_are_valid(workers):
    assert parse_scalingrun(run_document(workers=workers)).spec.workers.gpus_per_worker == workers["gpusPerWorker"]
