"""`scalingrun render`: the objects the operator creates, checked against the real API schemas."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from scalingrun_api.status_push import (
    STATUS_AUDIENCE, STATUS_CONFIG_MAP, STATUS_DIR, STATUS_PATH_VARIABLE,
)
from scalingrun_operator.schema.validation import parse_scalingrun
from scalingrun_operator.builders import build_children
from scalingrun_operator.builders.common import CONFIG_FILE
from scalingrun_operator.builders.config import build_trainer_config
from scalingrun_operator.builders.mpijob import (
    HOSTFILE, SSH_PORT, SSHD_STATE_DIR, WORKER_COMMAND, WORKER_WAIT_SECONDS,
)
from scalingrun_operator.cli import main
from scalingrun_trainer.cli import build_parser
from tests.support.env import require
from tests.support.specs import run_document

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("**/*.yaml") if "kind: ScalingSweep" not in p.read_text())
MPIJOB_CRD = ROOT.parent / "shared/crds/kubeflow.org_mpijobs.yaml"
# 1.20 silently drops completionMode: check against a release that has it.
K8S_SCHEMA_VERSION = "1.30.0"


def load(example: Path):
    return parse_scalingrun(yaml.safe_load(example.read_text()))


@pytest.fixture(scope="module")
def mpijob_schema():
    require(MPIJOB_CRD.exists(), f"{MPIJOB_CRD} not found")
    crd = yaml.safe_load(MPIJOB_CRD.read_text())
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_rendered_objects_pass_schema_validation(example, mpijob_schema):
    objects = build_children(load(example), namespace="ml")
    assert [o["kind"] for o in objects] == ["ConfigMap", "Job", "MPIJob"]
    for obj in objects[:2]:
        kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)
    jsonschema.validate(objects[2], mpijob_schema)


def test_children_have_deterministic_names_and_labels():
    run = load(ROOT / "examples/06-8-single-gpu-nodes.yaml")
    first = build_children(run, "ml")
    assert first == build_children(run, "ml")
    assert [o["metadata"]["name"] for o in first] == [
        "flowers-8nodes-runconfig", "flowers-8nodes-preprocess", "flowers-8nodes-train"]
    for obj in first:
        assert obj["metadata"]["namespace"] == "ml"
        assert obj["metadata"]["labels"]["scalingrun.dev/run"] == "flowers-8nodes"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "scalingrun-operator"


def test_mpijob_maps_workers_and_run_policy():
    run = load(ROOT / "examples/06-8-single-gpu-nodes.yaml")
    mpijob = build_children(run, "ml")[2]["spec"]
    assert mpijob["slotsPerWorker"] == 1
    assert mpijob["mpiReplicaSpecs"]["Worker"]["replicas"] == 8
    worker = mpijob["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["tolerations"][0] == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert mpijob["runPolicy"] == {
        # runPolicy.backoffLimit 2 plus the default maxInterruptions 10: a lost worker's launcher restart is no retry
        "cleanPodPolicy": "Running", "backoffLimit": 12, "suspend": False, "activeDeadlineSeconds": 86400,
        "ttlSecondsAfterFinished": 3600, "schedulingPolicy": {"minAvailable": 9, "queue": "training"}}
    # gang scheduling must not wait for workers (mpi-operator #608)
    assert mpijob["launcherCreationPolicy"] == "AtStartup"
    launcher = mpijob["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    script = launcher["command"][-1]
    assert "mpirun -np 8 " in script  # how the launcher waits for workers: tests of launcher_script


def _lost_node_tolerations(seconds: int) -> list[dict]:
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
            for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]


def test_workers_and_launcher_leave_a_lost_node_after_the_node_loss_grace_period():
    """The cluster evicts a lost node's pods after nodeLossGracePeriod, not its default 300 s; the user's own
    tolerations stay, and one of the user's for the same taint wins (the GPU workers' too: tests of test_gpu_shape)."""
    run = load(ROOT / "examples/06-8-single-gpu-nodes.yaml")
    replicas = build_children(run, "ml")[2]["spec"]["mpiReplicaSpecs"]
    worker, launcher = (replicas[r]["template"]["spec"]["tolerations"] for r in ("Worker", "Launcher"))
    aks_gpu_pool = {"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    assert worker == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, aks_gpu_pool,
                      *_lost_node_tolerations(60)]
    assert launcher == _lost_node_tolerations(60)

    spec = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec["spec"]["training"]["nodeLossGracePeriod"] = "2m"
    own = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
           "tolerationSeconds": 900}
    spec["spec"]["workers"]["tolerations"] = [own]
    replicas = build_children(parse_scalingrun(spec), "ml")[2]["spec"]["mpiReplicaSpecs"]
    assert replicas["Worker"]["template"]["spec"]["tolerations"] == [
        own, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, aks_gpu_pool,
        _lost_node_tolerations(120)[1]]
    assert replicas["Launcher"]["template"]["spec"]["tolerations"] == _lost_node_tolerations(120)


def test_workers_and_launcher_get_the_termination_grace_period_for_a_checkpoint_at_the_next_step():
    """SIGTERM leaves the ranks spec.workers.terminationGracePeriod for the checkpoint at their next step (default
    60 s, not Kubernetes' 30 s); the launcher, whose mpirun forwards its own SIGTERM, gets the same."""
    run = load(ROOT / "examples/06-8-single-gpu-nodes.yaml")
    assert run.spec.workers.termination_grace_period == 60
    replicas = build_children(run, "ml")[2]["spec"]["mpiReplicaSpecs"]
    assert [replicas[r]["template"]["spec"]["terminationGracePeriodSeconds"] for r in ("Worker", "Launcher")] == [
        60, 60]
    for given, seconds in ((90, 90), ("2m30s", 150), (0, 0)):
        spec = run.model_dump(mode="json", by_alias=True, exclude_none=True)
        spec["spec"]["workers"]["terminationGracePeriod"] = given
        replicas = build_children(parse_scalingrun(spec), "ml")[2]["spec"]["mpiReplicaSpecs"]
        assert [replicas[r]["template"]["spec"]["terminationGracePeriodSeconds"]
                for r in ("Worker", "Launcher")] == [seconds, seconds], given
    spec["spec"]["workers"]["terminationGracePeriod"] = "soon"
    with pytest.raises(Exception, match="duration such as 10m"):
        parse_scalingrun(spec)


@pytest.mark.parametrize("example", ["05-4gpus-one-node.yaml", "06-8-single-gpu-nodes.yaml"])
def test_launcher_waits_for_every_workers_sshd_then_execs_mpirun_whatever_the_creation_policy(example):
    replicas = build_children(load(ROOT / "examples" / example), "ml")[2]["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    shell, flag, script = launcher["command"]
    assert (shell, flag) == ("/bin/sh", "-c") and "args" not in launcher
    exec_, *argv = shlex.split(script)
    assert exec_ == "exec" and argv[:2] == ["scalingrun-trainer", "launch"]
    # The rendered line is one the trainer's own CLI accepts, with mpirun as the command it execs.
    args = build_parser().parse_args(argv[1:])
    assert (args.hostfile, args.ssh_port, args.timeout) == (HOSTFILE, SSH_PORT, WORKER_WAIT_SECONDS)
    assert args.command_line[0] == "--" and args.command_line[1:3] == ["mpirun", "-np"]
    assert args.command_line[-4:] == ["scalingrun-trainer", "train", "--config", CONFIG_FILE]
    # Workers: the image's entrypoint (host key) then sshd; a command keeps mpi-operator's default out.
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"] == WORKER_COMMAND and "args" not in worker


def test_single_node_waits_for_workers_and_counts_gpu_slots():
    run = load(ROOT / "examples/05-4gpus-one-node.yaml")
    mpijob = build_children(run, "ml")[2]["spec"]
    assert mpijob["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert mpijob["slotsPerWorker"] == 4
    assert "mpirun -np 4 " in mpijob["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][-1]
    assert build_trainer_config(run)["processes"] == 4


def test_preprocess_job_is_indexed_and_non_root():
    run = load(ROOT / "examples/04-full-data-petastorm.yaml")
    job = build_children(run, "ml")[1]["spec"]
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == 16
    pod = job["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}


def test_preprocess_job_has_the_deadline_of_the_spec_and_none_by_default():
    run = load(ROOT / "examples/04-full-data-petastorm.yaml")
    assert "activeDeadlineSeconds" not in build_children(run, "ml")[1]["spec"]
    spec = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec["spec"]["dataset"]["preprocessing"]["activeDeadlineSeconds"] = 5400
    job = build_children(parse_scalingrun(spec), "ml")[1]
    assert job["spec"]["activeDeadlineSeconds"] == 5400
    kubernetes_validate.validate(job, K8S_SCHEMA_VERSION, strict=True)


def _pod_specs(objects: list[dict]) -> dict[str, dict]:
    job, mpijob = objects[1], objects[2]
    specs = {"preprocess": job["spec"]["template"]["spec"]}
    for role, replica in mpijob["spec"]["mpiReplicaSpecs"].items():
        specs[role] = replica["template"]["spec"]
    return specs


def test_launcher_requests_are_small_by_default_and_settable():
    default = _pod_specs(build_children(load(ROOT / "examples/quickstart.yaml"), "ml"))["Launcher"]
    small = {"cpu": "100m", "memory": "256Mi"}
    assert default["containers"][0]["resources"] == {"requests": small, "limits": small}
    # 06 sets only the CPU; the memory keeps its default.
    settable = _pod_specs(build_children(load(ROOT / "examples/06-8-single-gpu-nodes.yaml"), "ml"))["Launcher"]
    chosen = {"cpu": "250m", "memory": "256Mi"}
    assert settable["containers"][0]["resources"] == {"requests": chosen, "limits": chosen}


def _with_cpu_limits(**limits):
    doc = yaml.safe_load((ROOT / "examples/quickstart.yaml").read_text())
    spec = doc["spec"]
    spec["workers"].update(cpu="2", memory="4Gi", gpusPerWorker=0)
    spec["dataset"]["preprocessing"]["resources"] = {"cpu": "1", "memory": "2Gi"}
    for path, limit in limits.items():
        part = {"workers": spec["workers"], "launcher": spec.setdefault("launcher", {}).setdefault("resources", {}),
                "preprocessing": spec["dataset"]["preprocessing"]["resources"]}[path]
        part["cpuLimit"] = limit
    return parse_scalingrun(doc)


def test_requests_equal_limits_unless_a_cpu_limit_is_asked_for(mpijob_schema):
    """Guaranteed QoS by default (a CPU limit equal to the request cost no images/s: docs/operations.md);
    cpuLimit sets another CPU limit, the memory stays request and limit."""
    default = _pod_specs(build_children(_with_cpu_limits(), "ml"))
    for role, pod in default.items():
        resources = pod["containers"][0]["resources"]
        assert resources["limits"] == resources["requests"], (role, resources)
    objects = build_children(_with_cpu_limits(workers="4", launcher="1", preprocessing="3"), "ml")
    jsonschema.validate(objects[2], mpijob_schema)
    kubernetes_validate.validate(objects[1], K8S_SCHEMA_VERSION, strict=True)
    asked = {role: pod["containers"][0]["resources"] for role, pod in _pod_specs(objects).items()}
    assert asked["Worker"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}}
    assert asked["Launcher"]["limits"]["cpu"] == "1" and asked["preprocess"]["limits"]["cpu"] == "3"
    assert asked["preprocess"]["requests"]["cpu"] == "1"


@pytest.mark.parametrize("path", ["workers", "launcher", "preprocessing"])
def test_a_cpu_limit_below_the_request_is_refused_with_its_field(path):
    with pytest.raises(ValueError) as caught:
        _with_cpu_limits(**{path: "50m"})
    field = {"workers": "spec.workers", "launcher": "spec.launcher.resources",
             "preprocessing": "spec.dataset.preprocessing.resources"}[path]
    assert f"{field}.cpuLimit: must be at least {field}.cpu" in str(caught.value)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_pod_gets_a_service_account_token(example):
    """None of them calls the Kubernetes API: a mounted token would only be something to steal."""
    specs = _pod_specs(build_children(load(example), "ml"))
    assert sorted(specs) == ["Launcher", "Worker", "preprocess"]
    for role, pod in specs.items():
        assert pod["automountServiceAccountToken"] is False, role


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_pod_may_push_its_runs_status_and_nothing_else(example):
    """The only token a pod gets is the status endpoint's: our audience (the API server refuses it), short-lived,
    with the endpoint's URL and CA from an optional ConfigMap; and the run's push path, forwarded to every rank."""
    children = build_children(load(example), "ml")
    specs = _pod_specs(children)
    for role, pod in specs.items():
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        sources = mounts[STATUS_DIR]["projected"]["sources"]
        tokens = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
        assert tokens == [{"audience": STATUS_AUDIENCE, "path": "token", "expirationSeconds": 3600}], role
        (config,) = [s["configMap"] for s in sources if "configMap" in s]
        assert config["name"] == STATUS_CONFIG_MAP and config["optional"] is True, role
        assert {"name": STATUS_PATH_VARIABLE, "value": "/v1/namespaces/ml/scalingruns/" + children[0]["metadata"][
            "labels"]["scalingrun.dev/run"]} in container["env"], role
        assert sum(1 for v in pod["volumes"] if "projected" in v) == 1, role  # no other token, anywhere
    launcher = specs["Launcher"]["containers"][0]["command"]
    assert f"-x {STATUS_PATH_VARIABLE}" in " ".join(launcher)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_container_has_a_read_only_root_and_writes_only_to_its_own_empty_dirs(example):
    specs = _pod_specs(build_children(load(example), "ml"))
    writable = {"preprocess": {"/tmp"}, "Launcher": {"/tmp"}, "Worker": {"/tmp", SSHD_STATE_DIR}}
    for role, pod in specs.items():
        container = pod["containers"][0]
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}, role
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        assert {path for path, volume in mounts.items() if volume.get("emptyDir") == {}} == writable[role], role
        assert mounts["/etc/scalingrun"]["configMap"]  # the rest is read-only: the config, and mpi-operator's mounts


def test_credentials_only_as_secret_references():
    run = load(ROOT / "examples/01-sample-1gpu.yaml")
    for obj in build_children(run, "ml"):
        text = json.dumps(obj)
        assert "s3-credentials" not in text or obj["kind"] != "ConfigMap"
    config_map = build_children(run, "ml")[0]
    assert "s3-credentials" not in config_map["data"]["config.json"]
    job_env = build_children(run, "ml")[1]["spec"]["template"]["spec"]["containers"][0]["env"]
    secret_vars = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in job_env
                   if "secretKeyRef" in e.get("valueFrom", {})}
    assert secret_vars == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    # The rest of valueFrom is the Job's own uid: the id of the plan shard 0 writes and the others wait for.
    others = {e["name"]: e["valueFrom"] for e in job_env if "valueFrom" in e and e["name"] not in secret_vars}
    # The Job's uid under both of the Job controller's pod labels: the 1.27+ name first, the legacy one beside it.
    assert others == {
        "SCALINGRUN_PLAN_ID": {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}},
        "SCALINGRUN_PLAN_ID_LEGACY": {"fieldRef": {"fieldPath": "metadata.labels['controller-uid']"}},
    }


def test_mlflow_credentials_only_as_optional_secret_references_forwarded_to_every_rank():
    run = load(ROOT / "examples/06-8-single-gpu-nodes.yaml")
    config_map, _, mpijob = build_children(run, "ml")
    config = json.loads(config_map["data"]["config.json"])
    assert config["tracking"] == {"mlflowTrackingUri": "http://mlflow.mlops:5000", "experimentName": "flowers"}
    assert "mlflow-credentials" not in config_map["data"]["config.json"]
    specs = mpijob["spec"]["mpiReplicaSpecs"]
    for role in ("Launcher", "Worker"):
        env = specs[role]["template"]["spec"]["containers"][0]["env"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if e["name"].startswith("MLFLOW_")}
        assert refs == {var: {"name": "mlflow-credentials", "key": var, "optional": True}
                        for var in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    # Rank 0 runs on a worker, started by the launcher's mpirun: the variables must travel with -x.
    script = specs["Launcher"]["template"]["spec"]["containers"][0]["command"][-1]
    for var in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert f"-x {var}" in script
    untracked = build_children(load(ROOT / "examples/05-4gpus-one-node.yaml"), "ml")[2]
    assert "MLFLOW_" not in json.dumps(untracked)


def test_trainer_config_resolves_run_location():
    run = load(ROOT / "examples/02-early-stopping.yaml")
    config = build_trainer_config(run)
    assert config["runLocation"] == "s3://datasets/flowers/parquet-sample/runs/flowers-early-stopping"
    assert config["training"]["earlyStopping"]["patience"] == 3
    assert "workers" not in config and "credentialsSecret" not in config["storage"]


def test_cli_render_prints_multi_document_yaml(capsys):
    assert main(["render", "-f", str(ROOT / "examples/quickstart.yaml"), "-n", "team-a"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job", "MPIJob"]
    assert {d["metadata"]["namespace"] for d in docs} == {"team-a"}


def test_cli_render_rejects_invalid_run(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load((ROOT / "examples/quickstart.yaml").read_text())
    doc["spec"]["workers"]["replicas"] = 0
    bad.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(bad)]) == 1
    assert "spec.workers.replicas" in capsys.readouterr().err


def lightning_run(**workers):
    doc = yaml.safe_load((ROOT / "examples/quickstart-lightning.yaml").read_text())
    doc["spec"]["workers"].update(workers)
    return parse_scalingrun(doc)


def test_lightning_run_renders_its_image_threads_and_the_same_launcher(mpijob_schema):
    config_map, job, mpijob = build_children(lightning_run(cpu="3500m", gpusPerWorker=0), "ml")
    jsonschema.validate(mpijob, mpijob_schema)
    kubernetes_validate.validate(job, K8S_SCHEMA_VERSION, strict=True)
    assert json.loads(config_map["data"]["config.json"])["training"]["framework"] == "pytorch-lightning"
    replicas = mpijob["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    # The Lightning image everywhere, the preprocessing Job included (it needs no TensorFlow).
    images = {launcher["image"], worker["image"], job["spec"]["template"]["spec"]["containers"][0]["image"]}
    assert images == {"ghcr.io/scalingrun/trainer:0.1.0-lightning-cpu"}
    # torch threads from the CPU limit (the request unless cpuLimit is set), forwarded by mpirun to every rank.
    for container in (launcher, worker):
        assert {"name": "OMP_NUM_THREADS", "value": "3"} in container["env"]
    argv = shlex.split(launcher["command"][-1])
    assert argv[argv.index("mpirun") + 1:argv.index("mpirun") + 3] == ["-np", "2"]
    assert "-x OMP_NUM_THREADS" in launcher["command"][-1]
    assert argv[-4:] == ["scalingrun-trainer", "train", "--config", CONFIG_FILE]
    assert worker["command"] == WORKER_COMMAND


def test_lightning_image_is_settable_and_keras_runs_are_unchanged():
    _, job, mpijob = build_children(lightning_run(image="registry.local/trainer:lightning-gpu", gpusPerWorker=2, cpu=None), "ml")
    worker = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["image"] == "registry.local/trainer:lightning-gpu"
    assert not any(e["name"] == "OMP_NUM_THREADS" for e in worker["env"])  # workers.cpu unset: torch decides
    keras = build_children(load(ROOT / "examples/quickstart.yaml"), "ml")[2]
    keras_worker = keras["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert keras_worker["image"] == "ghcr.io/scalingrun/trainer:0.1.0-cpu"
    assert "OMP_NUM_THREADS" not in json.dumps(keras)


@pytest.mark.parametrize("cpu, cpu_limit, threads", [("500m", None, "1"), ("2", "3500m", "3"), (None, "2", "2"),
                                                      ("1500m", "1500m", "1")])
def test_lightning_threads_follow_the_cpu_limit(cpu, cpu_limit, threads):
    workers = {"cpu": cpu, "gpusPerWorker": 0, **({"cpuLimit": cpu_limit} if cpu_limit else {})}
    worker = build_children(lightning_run(**workers), "ml")[2]["spec"]["mpiReplicaSpecs"]["Worker"]
    assert {"name": "OMP_NUM_THREADS", "value": threads} in worker["template"]["spec"]["containers"][0]["env"]


def test_cli_render_shows_a_lightning_run(capsys):
    assert main(["render", "-f", str(ROOT / "examples/quickstart-lightning.yaml"), "-n", "team-a"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Job", "MPIJob"]
    assert "0.1.0-lightning-cpu" in yaml.safe_dump(docs[2])


def test_horovod_ranks_get_a_stall_shutdown_and_other_engines_do_not():
    keras = build_children(load(ROOT / "examples/quickstart.yaml"), "ml")[2]["spec"]["mpiReplicaSpecs"]
    launcher = keras["Launcher"]["template"]["spec"]["containers"][0]
    for container in (launcher, keras["Worker"]["template"]["spec"]["containers"][0]):
        assert {"name": "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "value": "390"} in container["env"]
    assert "-x HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in launcher["command"][-1]  # forwarded to every rank
    assert "HOROVOD_STALL" not in json.dumps(build_children(lightning_run(), "ml")[2])


@pytest.mark.parametrize("dataset_format", ["jpeg-tree", "parquet"])
def test_every_pod_of_the_run_pulls_with_its_image_pull_secrets(mpijob_schema, dataset_format):
    """spec.workers.imagePullSecrets reach the preprocessing (or Parquet check) Job, the launcher and the workers,
    as pod-spec references; a run without them renders none."""
    document = run_document(dataset={"format": dataset_format},
                            workers={"imagePullSecrets": ["mirror-pull", "team-registry"]})
    objects = build_children(parse_scalingrun(document), "ml")
    kubernetes_validate.validate(objects[1], K8S_SCHEMA_VERSION, strict=True)
    jsonschema.validate(objects[2], mpijob_schema)
    specs = _pod_specs(objects)
    assert sorted(specs) == ["Launcher", "Worker", "preprocess"]
    for role, pod in specs.items():
        assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}, {"name": "team-registry"}], role
    plain = _pod_specs(build_children(load(ROOT / "examples/quickstart.yaml"), "ml"))
    assert not [role for role, pod in plain.items() if "imagePullSecrets" in pod]


@pytest.mark.parametrize("value, says", [
    ([{"name": "regcred"}], "spec.workers.imagePullSecrets[0]: write the Secret's name alone (- regcred), not an object"),
    (["Reg_Cred"], "spec.workers.imagePullSecrets[0]: must be a Kubernetes name"),
    ("regcred", "spec.workers.imagePullSecrets: Input should be a valid array"),
])
def test_image_pull_secrets_are_secret_names(value, says):
    document = yaml.safe_load((ROOT / "examples/quickstart.yaml").read_text())
    document["spec"]["workers"]["imagePullSecrets"] = value
    with pytest.raises(ValueError) as caught:
        parse_scalingrun(document)
    assert says in str(caught.value)
