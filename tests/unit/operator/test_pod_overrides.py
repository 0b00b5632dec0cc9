"""spec.podOverrides (issue #52, item 2): what a run adds to its preprocessing, launcher and worker pods reaches them,
in the spec's order after the operator's own; what the operator owns cannot be overridden; and every refusal is a
sentence that names the field, the same for validate and the operator (one parse_scalingrun)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from scalingrun_operator.builders import build_mpijob, build_preprocess_job
from scalingrun_operator.builders.capacity_probes import build_capacity_probe
from scalingrun_operator.schema.pod_overrides import (
    RESERVED_ENV, RESERVED_ENV_PREFIXES, RESERVED_LABEL_PREFIXES, RESERVED_LABELS, RESERVED_PATHS, RESERVED_VOLUMES,
)
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from tests.support.specs import run_document

CACHE = {"name": "cache", "emptyDir": {"sizeLimit": "1Gi"}}
SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
          "labelSelector": {"matchLabels": {"scalingrun.dev/run": "demo"}}}
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["train"]}]}]}}}


def everything() -> dict[str, Any]:
    return {"targets": ["preprocess", "launcher", "workers"],
            "metadata": {"labels": {"team": "vision"}, "annotations": {"sidecar.istio.io/inject": "false"}},
            "volumes": [CACHE], "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
            "env": [{"name": "HF_HOME", "value": "/cache"}], "envFrom": [{"configMapRef": {"name": "team-env"}}],
            "nodeSelector": {"pool": "train"}, "affinity": AFFINITY,
            "tolerations": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
            "topologySpreadConstraints": [SPREAD], "priorityClassName": "batch-low"}


def parsed(*overrides: dict[str, Any], allow_host_path: bool = False, **sections: dict[str, Any]):
    doc = run_document(**sections)
    doc["spec"]["podOverrides"] = [copy.deepcopy(o) for o in overrides]
    return parse_scalingrun(doc, allow_host_path)


def errors(*overrides: dict[str, Any], **kwargs: Any) -> dict[str, str]:
    with pytest.raises(InvalidScalingRun) as caught:
        parsed(*overrides, **kwargs)
    return {e.path: e.message for e in caught.value.errors}


def templates(run) -> dict[str, dict[str, Any]]:
    specs = build_mpijob(run, "ns")["spec"]["mpiReplicaSpecs"]
    return {"preprocess": build_preprocess_job(run, "ns")["spec"]["template"],
            "launcher": specs["Launcher"]["template"], "workers": specs["Worker"]["template"]}


def test_an_override_reaches_every_pod_it_targets_after_the_operators_own():
    run = parsed(everything())
    plain = templates(parsed())
    for role, template in templates(run).items():
        meta, spec, container = template["metadata"], template["spec"], template["spec"]["containers"][0]
        ours = plain[role]["spec"]
        assert meta["labels"] == {**plain[role]["metadata"]["labels"], "team": "vision"}, role
        assert meta["annotations"] == {"sidecar.istio.io/inject": "false"}
        assert spec["volumes"] == [*ours["volumes"], CACHE]
        assert container["volumeMounts"] == [*ours["containers"][0]["volumeMounts"],
                                             {"name": "cache", "mountPath": "/cache"}]
        assert container["env"] == [*ours["containers"][0]["env"], {"name": "HF_HOME", "value": "/cache"}]
        assert container["envFrom"] == [{"configMapRef": {"name": "team-env"}}]
        assert spec["nodeSelector"] == {"pool": "train"} and spec["affinity"] == AFFINITY
        assert spec["topologySpreadConstraints"] == [SPREAD] and spec["priorityClassName"] == "batch-low"
        assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
        for owned in ("securityContext", "automountServiceAccountToken"):
            assert spec[owned] == ours[owned]
        command = container["command"]
        if role == "launcher":  # with the launcher's variable forwarded to every rank (mpirun -x): the next test
            assert command[-1].count(" -x HF_HOME ") == 1
            command = [*command[:-1], command[-1].replace(" -x HF_HOME ", " ")]
        assert command == ours["containers"][0]["command"]


def test_the_launchers_override_variables_reach_every_rank_through_mpirun():
    """ssh starts the ranks without the worker pods' environment: mpirun forwards the launcher's (-x), ours first."""
    nccl = {"targets": ["launcher", "workers"], "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]}
    workers_only = {"targets": ["workers"], "env": [{"name": "TEAM_ONLY", "value": "1"}]}
    script = templates(parsed(nccl, workers_only))["launcher"]["spec"]["containers"][0]["command"][-1]
    plain = templates(parsed())["launcher"]["spec"]["containers"][0]["command"][-1]
    forwarded = re.findall(r"-x (\S+)", script)
    assert forwarded == [*re.findall(r"-x (\S+)", plain), "NCCL_SOCKET_IFNAME"]
    assert "TEAM_ONLY" not in script


def test_an_override_touches_only_its_targets_and_the_workers_keep_their_own_placement():
    run = parsed({"targets": ["workers"], "nodeSelector": {"zone": "a"}, "metadata": {"labels": {"x": "1"}},
                  "tolerations": [{"key": "spot", "operator": "Exists"}]},
                 workers={"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "a", "operator": "Exists"}],
                          "gpusPerWorker": 1})
    found = templates(run)
    assert "x" not in found["launcher"]["metadata"]["labels"] and "x" not in found["preprocess"]["metadata"]["labels"]
    workers = found["workers"]["spec"]
    assert workers["nodeSelector"] == {"pool": "gpu", "zone": "a"}
    keys = [t.get("key") for t in workers["tolerations"]]
    assert keys[:2] == ["a", "spot"] and "nvidia.com/gpu" in keys  # the GPU ones still added after the user's


def test_an_elastic_runs_capacity_probe_follows_the_workers_placement_but_not_their_volumes():
    run = parsed(everything(), workers={"replicas": 4, "minReplicas": 2})
    probe = build_capacity_probe(run, "ns", 0)["spec"]
    assert probe["nodeSelector"] == {"pool": "train"} and probe["affinity"] == AFFINITY
    assert "volumes" not in probe and probe["priorityClassName"] == "scalingrun-capacity-probe"


def test_overrides_are_applied_in_order_and_the_same_spec_renders_the_same_pods():
    first = {"targets": ["workers"], "env": [{"name": "A", "value": "1"}], "volumes": [CACHE]}
    second = {"targets": ["workers", "launcher"], "env": [{"name": "B", "value": "2"}],
              "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    run = parsed(first, second)
    worker = templates(run)["workers"]["spec"]
    assert [e["name"] for e in worker["containers"][0]["env"]][-2:] == ["A", "B"]
    assert [v["name"] for v in worker["volumes"]][-2:] == ["cache", "data"]
    assert templates(run) == templates(parsed(first, second))


@pytest.mark.parametrize("override,path,words", [
    ({"metadata": {"labels": {"scalingrun.dev/run": "other"}}}, "spec.podOverrides[0].metadata.labels",
     "scalingrun.dev/run is set by the operator"),
    ({"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}, "spec.podOverrides[0].metadata.labels",
     "is set by the operator"),
    ({"metadata": {"labels": {"training.kubeflow.org/job-role": "x"}}}, "spec.podOverrides[0].metadata.labels",
     "mpi-operator"),
    ({"metadata": {"labels": {"bad key!": "x"}}}, "spec.podOverrides[0].metadata.labels", "not a valid key"),
    ({"metadata": {"annotations": {"scalingrun.dev/pinned": "x"}}}, "spec.podOverrides[0].metadata.annotations",
     "is set by the operator"),
    ({"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}]}, "spec.podOverrides[0].env[0].name",
     "AWS_SECRET_ACCESS_KEY is set by the operator"),
    ({"env": [{"name": "SCALINGRUN_STATUS_PATH", "value": "x"}]}, "spec.podOverrides[0].env[0].name", "reserved"),
    ({"env": [{"name": "PATH", "value": "/x"}]}, "spec.podOverrides[0].env[0].name", "reserved"),
    ({"env": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
     "spec.podOverrides[0].env[0]", "both value and valueFrom"),
    ({"envFrom": [{"prefix": "X_"}]}, "spec.podOverrides[0].envFrom[0]", "exactly one of configMapRef"),
    ({"volumes": [{"name": "config", "emptyDir": {}}]}, "spec.podOverrides[0].volumes[0].name",
     "config is a volume of the operator's"),
    ({"volumes": [{"emptyDir": {}}]}, "spec.podOverrides[0].volumes[0].name", "required"),
    ({"volumes": [{"name": "two", "emptyDir": {}, "configMap": {"name": "x"}}]}, "spec.podOverrides[0].volumes[0]",
     "exactly one source"),
    ({"volumes": [{"name": "host", "hostPath": {"path": "/data"}}]}, "spec.podOverrides[0].volumes[0].hostPath",
     "runs.allowHostPath"),
    ({"volumes": [CACHE], "volumeMounts": [{"name": "cache", "mountPath": "/tmp"}]},
     "spec.podOverrides[0].volumeMounts[0].mountPath", "would hide the operator's mount at /tmp"),
    ({"volumes": [CACHE], "volumeMounts": [{"name": "cache", "mountPath": "/etc"}]},
     "spec.podOverrides[0].volumeMounts[0].mountPath", "/etc/scalingrun"),
    ({"volumeMounts": [{"name": "nowhere", "mountPath": "/data"}]}, "spec.podOverrides[0].volumeMounts[0].name",
     "nowhere is no volume of the worker pods"),
])
def test_what_the_operator_owns_is_refused_with_a_sentence_naming_the_field(override, path, words):
    found = errors({"targets": ["workers"], **override})
    assert path in found, found
    assert words in found[path]


def test_two_overrides_of_the_same_pods_cannot_contradict_each_other_or_spec_workers():
    found = errors({"targets": ["workers"], "env": [{"name": "A", "value": "1"}], "affinity": AFFINITY,
                    "nodeSelector": {"pool": "cpu"}},
                   {"targets": ["workers"], "env": [{"name": "A", "value": "2"}], "affinity": AFFINITY,
                    "priorityClassName": "other"},
                   workers={"nodeSelector": {"pool": "gpu"}, "priorityClassName": "high"})
    assert "A is given to the worker pods by spec.podOverrides[0].env[0].name already" in \
        found["spec.podOverrides[1].env[0].name"]
    assert "spec.podOverrides[0].affinity" in found["spec.podOverrides[1].affinity"]
    assert "spec.workers.nodeSelector" in found["spec.podOverrides[0].nodeSelector"]
    assert "spec.workers.priorityClassName" in found["spec.podOverrides[1].priorityClassName"]
    # The same label with the same value twice says one thing: accepted.
    same = {"targets": ["workers"], "metadata": {"labels": {"team": "a"}}}
    assert parsed(same, same).spec.pod_overrides


def test_host_path_is_accepted_where_the_operator_allows_it():
    host = {"targets": ["workers"], "volumes": [{"name": "host", "hostPath": {"path": "/data"}}],
            "volumeMounts": [{"name": "host", "mountPath": "/data"}]}
    run = parsed(host, allow_host_path=True)
    assert {"name": "host", "hostPath": {"path": "/data"}} in templates(run)["workers"]["spec"]["volumes"]


@pytest.mark.parametrize("field", ["securityContext", "containers", "hostNetwork", "serviceAccountName"])
def test_fields_the_operator_owns_are_not_part_of_an_override(field):
    found = errors({"targets": ["launcher"], field: {}})
    assert any(field in path for path in found), found


def test_the_reserved_names_cover_everything_the_builders_set():
    """Every label, variable, volume and mount path the operator renders is one an override may not give."""
    doc = run_document(workers={"gpusPerWorker": 1, "cpu": "4"}, training={"framework": "pytorch-lightning"},
                       tracking={"mlflowTrackingUri": "http://mlflow:5000", "credentialsSecret": "ml"},
                       storage={"credentialsSecret": "s3", "endpoint": "http://minio:9000"})
    runs = [parse_scalingrun(doc), parse_scalingrun(run_document(workers={"gpusPerWorker": 2}))]
    for run in runs:
        for role, template in templates(run).items():
            for key in template["metadata"]["labels"]:
                assert key in RESERVED_LABELS or key.startswith(RESERVED_LABEL_PREFIXES), (role, key)
            container = template["spec"]["containers"][0]
            for env in container["env"]:
                assert env["name"] in RESERVED_ENV or env["name"].startswith(RESERVED_ENV_PREFIXES), (role, env)
            assert {v["name"] for v in template["spec"]["volumes"]} <= RESERVED_VOLUMES, role
            assert {m["mountPath"] for m in container["volumeMounts"]} <= set(RESERVED_PATHS), role


def test_validate_refuses_host_path_unless_told_the_operator_allows_it(tmp_path, capsys):
    import yaml

    from scalingrun_operator.cli import main

    doc = run_document()
    doc["spec"]["podOverrides"] = [{"targets": ["workers"], "volumes": [{"name": "h", "hostPath": {"path": "/d"}}]}]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "-f", str(path)]) == 1
    assert "spec.podOverrides[0].volumes[0].hostPath: a node's own files are refused" in capsys.readouterr().err
    assert main(["validate", "-f", str(path), "--allow-host-path"]) == 0


def test_the_operator_refuses_host_path_by_its_setting_and_renders_it_when_allowed():
    from scalingrun_operator.decide.snapshot import Create, Settings
    from tests.support.decide_world import SPEC, World, conditions

    spec = copy.deepcopy(SPEC)
    spec["podOverrides"] = [{"targets": ["preprocess"], "volumes": [{"name": "h", "hostPath": {"path": "/d"}}],
                             "volumeMounts": [{"name": "h", "mountPath": "/d"}]}]
    refused = World(spec=spec, pinned=False).decide()
    status, reason, message = conditions(refused)["Failed"]
    assert (status, reason) == ("True", "InvalidSpec") and "spec.podOverrides[0].volumes[0].hostPath" in message
    allowed = World(spec=spec, pinned=False).decide(Settings(allow_host_path=True))
    jobs = [a.obj for a in allowed.actions if isinstance(a, Create) and a.obj["kind"] == "Job"]
    assert {"name": "h", "hostPath": {"path": "/d"}} in jobs[0]["spec"]["template"]["spec"]["volumes"]


def test_the_pods_with_every_override_pass_kubernetes_and_mpi_operators_schemas():
    import os
    from pathlib import Path

    import jsonschema
    import kubernetes_validate
    import yaml

    from tests.support.env import require

    run = parsed(everything())
    kubernetes_validate.validate(build_preprocess_job(run, "ns"), "1.30.0", strict=True)
    crd_path = Path(os.environ.get("SCALINGRUN_MPIJOB_CRD", Path(__file__).resolve().parents[4]
                                   / "shared/crds/kubeflow.org_mpijobs.yaml"))
    require(crd_path.exists(), f"{crd_path} not found (set SCALINGRUN_MPIJOB_CRD)")
    crd = yaml.safe_load(crd_path.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v2beta1")["schema"]["openAPIV3Schema"]
    jsonschema.validate(build_mpijob(run, "ns"), schema)
