"""The Helm chart: lint, render for several values files, validate every object against its schema."""

from __future__ import annotations

import json
import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from tests.support.chart import CHART, ROOT, helm, render  # noqa: F401 (fixtures)


VALUES = [None, *sorted((CHART / "ci").glob("*-values.yaml"))]
K8S_SCHEMA_VERSION = "1.30.0"


def crd_schemas() -> dict[tuple[str, str], dict]:
    schemas = {}
    for path in (ROOT / "manifests/crd").glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                for version in crd["spec"]["versions"]:
                    api = f"{crd['spec']['group']}/{version['name']}"
                    schemas[(api, crd["spec"]["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name if v else "default")
def test_lint_strict(helm, values):
    args = [helm, "lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    result = subprocess.run(args, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name if v else "default")
def test_rendered_objects_are_valid(helm, values):
    schemas = crd_schemas()
    for obj in render(helm, values):
        key = (obj["apiVersion"], obj["kind"])
        if key in schemas:
            jsonschema.validate(obj, schemas[key])
        elif obj["kind"] == "ServiceMonitor":
            assert obj["spec"]["endpoints"][0]["port"] == "metrics"  # no schema shipped here for it
        elif obj["kind"] == "PrometheusRule":  # no schema shipped here either: tests/chart/test_monitoring.py
            assert [rule["alert"] for rule in obj["spec"]["groups"][0]["rules"]]
        else:
            kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)


def test_operator_pod_is_locked_down(helm):
    deployment = next(o for o in render(helm) if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # No Service of the namespace may inject <SERVICE>_PORT=tcp://... variables into the operator.
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # A slow start is the startup probe's to judge, for minutes; the liveness probe waits for it.
    startup = container["startupProbe"]
    assert startup["httpGet"] == container["livenessProbe"]["httpGet"]
    assert (startup["periodSeconds"], startup["failureThreshold"]) == (5, 60)  # 5 min before a restart
    assert "initialDelaySeconds" not in container["livenessProbe"]
    assert "--all-namespaces" in container["args"] and "--lease=t-scalingrun" in container["args"]
    assert container["image"].endswith(":" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def test_the_operator_pulls_with_the_image_pull_secrets_by_name_or_as_in_a_pod_spec(helm):
    def pod(*args):
        return next(o for o in render(helm, *args) if o["kind"] == "Deployment")["spec"]["template"]["spec"]

    assert "imagePullSecrets" not in pod()
    mirror = pod(CHART / "ci/mirror-values.yaml", "--set", "imagePullSecrets[1].name=team-registry")
    assert mirror["imagePullSecrets"] == [{"name": "mirror-pull"}, {"name": "team-registry"}]
    assert mirror["containers"][0]["image"].startswith("registry.example.com/mirror/scalingrun/operator:")


def test_namespaced_install_uses_roles_only(helm):
    objects = render(helm, CHART / "ci/namespaced-values.yaml")
    bindings = [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"]
    # Cluster-wide: only namespace list/watch, node get, TokenReviews (cluster-scoped) and CRD list/watch.
    assert bindings == ["t-scalingrun-namespace-watch", "t-scalingrun-status-push", "t-scalingrun-node-read",
                        "t-scalingrun-crd-watch"]
    roles = [o for o in objects if o["kind"] == "Role"]
    # The leader's Lease, the status endpoint's pod label and its certificate's Secret, in the release's namespace.
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml-team-a", "ml-team-b", "scalingrun-system",
                                                                 "scalingrun-system", "scalingrun-system"]
    for role in roles:
        assert not [r for r in role["rules"] if r["apiGroups"] == ["kopf.dev"]]
    args = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=ml-team-a" in args and "--all-namespaces" not in args


def test_crd_kept_on_uninstall_and_optional(helm):
    crd = next(o for o in render(helm) if o["kind"] == "CustomResourceDefinition"
               and o["metadata"]["name"] == "scalingruns.scalingrun.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [o for o in render(helm, CHART / "ci/standalone-values.yaml") if o["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name if v else "default")
def test_every_port_names_its_protocol(helm, values):
    """Server-side apply (helm 4's default) on 1.20 refuses a port list entry without its key `protocol`."""
    for obj in render(helm, values):
        if obj["kind"] == "Service":
            ports = obj["spec"]["ports"]
        elif obj["kind"] == "Deployment":
            ports = [p for c in obj["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        else:
            continue
        assert ports and all(p.get("protocol") == "TCP" for p in ports), (obj["kind"], ports)


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name if v else "default")
def test_no_hooks_and_no_peering_objects(helm, values):
    """kopf pauses silently without its peering object, and a hook does not run while `helm install --wait`
    waits: the operator creates the object itself at start."""
    for obj in render(helm, values):
        assert obj["kind"] not in ("ClusterKopfPeering", "KopfPeering")
        assert not [a for a in obj["metadata"].get("annotations") or {} if a.startswith("helm.sh/hook")], obj["kind"]


def test_kustomize_installs_the_charts_crds_and_no_others(helm):
    """manifests/crd is what the chart installs: kopf's peering CRDs, which no install uses (a Lease elects the
    leader), are not in it."""
    listed = yaml.safe_load((ROOT / "manifests/crd/kustomization.yaml").read_text())["resources"]
    kustomize = {yaml.safe_load((ROOT / "manifests/crd" / name).read_text())["metadata"]["name"] for name in listed}
    chart = {o["metadata"]["name"] for o in render(helm) if o["kind"] == "CustomResourceDefinition"}
    assert kustomize == chart == {"scalingruns.scalingrun.dev", "scalingsweeps.scalingrun.dev"}


def test_operator_reads_pods_and_needs_no_peering_objects(helm):
    role = next(o for o in render(helm) if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "t-scalingrun-operator")
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for resource in rule["resources"]:
            verbs.setdefault(resource, set()).update(rule["verbs"])
    assert "clusterkopfpeerings" not in verbs and "kopfpeerings" not in verbs  # a Lease, not kopf peering
    # Listed and watched, never read one by one; deleted: a lost or stalled training pod, a capacity probe. Created:
    # only with elastic.capacityProbes (tests/chart/test_chart_least_privilege.py).
    assert verbs["pods"] == {"list", "watch", "delete"}
    assert verbs["pods/log"] == {"get"}  # the failed launcher's last lines, nothing more


def test_two_replicas_elect_a_leader_with_a_lease_in_their_namespace_only(helm):
    objects = render(helm)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert "strategy" not in deployment["spec"]  # a rolling update: new pods start as standbys
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] if "value" in e else e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in pod["containers"][0]["env"]}
    assert env["SCALINGRUN_LEASE_HOLDER"] == "metadata.name" and env["SCALINGRUN_LEASE_NAMESPACE"] == "metadata.namespace"
    assert (env["SCALINGRUN_LEASE_RENEW_SECONDS"], env["SCALINGRUN_LEASE_RENEW_DEADLINE_SECONDS"],
            env["SCALINGRUN_LEASE_DURATION_SECONDS"]) == ("5", "10", "15")
    # Least privilege: a Role (not a ClusterRole) in the release's namespace; get/update only its own Lease.
    lease_rules = [(o["kind"], o["metadata"].get("namespace"), rule) for o in objects if o["kind"].endswith("Role")
                   for rule in o.get("rules", []) if "leases" in rule["resources"]]
    assert lease_rules == [
        ("Role", "scalingrun-system", {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}),
        ("Role", "scalingrun-system", {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                       "resourceNames": ["t-scalingrun"], "verbs": ["get", "update"]})]
    # Replicas preferably on different nodes; a drain takes one at a time.
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    pdb = next(o for o in objects if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}}
    # Standalone: one replica, replaced (never rolled), no Lease, no budget.
    standalone = render(helm, CHART / "ci/standalone-values.yaml")
    single = next(o for o in standalone if o["kind"] == "Deployment")
    assert single["spec"]["strategy"]["type"] == "Recreate" and single["spec"]["replicas"] == 1
    assert "--standalone" in single["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [o for o in standalone if o["kind"] == "PodDisruptionBudget" or "leader-election" in o["metadata"]["name"]]


@pytest.mark.parametrize("release", ["scalingrun", "other", "ml-ops"])
def test_names_follow_the_release(helm, release):
    """Every reference between the chart's objects resolves under any release name."""
    objects = render(helm, None, release=release)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    account = next(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount")
    assert account == (release if "scalingrun" in release else f"{release}-scalingrun")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    service = next(o for o in objects if o["kind"] == "Service")
    assert service["spec"]["selector"] == selector
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in names
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "scalingrun-system"}]


@pytest.mark.parametrize("bad", [["--set", "replicaCount=2", "--set", "leaderElection.enabled=false"],
                                 ["--set", "leaderElection.renewDeadlineSeconds=20"],
                                 ["--set", "leaderElection.renewSeconds=10"],
                                 ["--set", "replicaCount=-1"], ["--set", "peering.name=scalingrun"],
                                 ["--set", "unknownKey=1"], ["--set", "operator.logFormat=xml"],
                                 ["--set", "imagePullSecrets[0]=Mirror_Pull"],
                                 ["--set", "imagePullSecrets[0].nam=mirror-pull"]])
def test_bad_values_are_refused(helm, bad):
    result = subprocess.run([helm, "template", "t", str(CHART), *bad], capture_output=True, text=True)
    assert result.returncode != 0 and result.stderr


def test_chart_versions_follow_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
                   if line.startswith("version = "))
    assert chart["version"] == chart["appVersion"] == version


def test_kustomize_base_is_the_rendered_chart(helm):
    """The chart's defaults, the push path: the render holds no key (the operator makes its certificate at its
    start), so a static base serves every cluster (docs/install.md, "Install without Helm (kustomize)")."""
    rendered = render(helm, None, "--set", "crds.enabled=false", "--set", "podDisruptionBudget.enabled=false",
                      release="scalingrun")
    assert not [d for d in rendered if d["kind"] == "Secret"]
    base = [d for d in yaml.safe_load_all((ROOT / "manifests/base/scalingrun.yaml").read_text()) if d]
    assert base == rendered, "manifests/base is out of date: run scripts/generate.sh"


def test_no_network_policy_for_the_runs_unless_enabled_and_the_operators_unless_turned_off(helm):
    for values in VALUES:
        enabled = values is not None and yaml.safe_load(values.read_text()).get("networkPolicy", {}).get("enabled")
        policies = [o["metadata"]["name"] for o in render(helm, values) if o["kind"] == "NetworkPolicy"]
        assert ("t-scalingrun-runs" in policies) == bool(enabled), values
        assert "t-scalingrun-operator" in policies, values
    turned_off = render(helm, None, "--set", "networkPolicy.operator.enabled=false")
    assert not [o for o in turned_off if o["kind"] == "NetworkPolicy"]


def test_network_policy_lets_run_pods_reach_each_other_dns_storage_and_tracking_only(helm):
    from scalingrun_operator.schema.validation import parse_scalingrun
    from scalingrun_operator.builders import build_children
    from scalingrun_operator.builders.common import RUN_LABEL

    values_file = CHART / "ci/networkpolicy-values.yaml"
    values = yaml.safe_load(values_file.read_text())["networkPolicy"]
    rendered = render(helm, values_file)
    policies = [o for o in rendered if o["kind"] == "NetworkPolicy"]
    # One per watched namespace, and the operator's own (in to its status port, the push path's: the default).
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies] == [
        ("ml-team-a", "t-scalingrun-runs"), ("ml-team-b", "t-scalingrun-runs"),
        ("scalingrun-system", "t-scalingrun-operator")]
    runs = {"matchExpressions": [{"key": RUN_LABEL, "operator": "Exists"}]}
    operator_pods = next(o for o in rendered if o["kind"] == "Deployment")["spec"]["selector"]["matchLabels"]
    to_status = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "scalingrun-system"}},
                         "podSelector": {"matchLabels": operator_pods}}], "ports": [{"port": 8443, "protocol": "TCP"}]}
    for policy in policies[:2]:
        spec = policy["spec"]
        assert spec["podSelector"] == runs and spec["policyTypes"] == ["Ingress", "Egress"]
        assert spec["ingress"] == [{"from": [{"podSelector": runs}], "ports": [{"protocol": "TCP"}]}]
        defaults = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]
        assert spec["egress"] == [{"to": [{"podSelector": runs}], "ports": [{"protocol": "TCP"}]}, to_status,
                                  *defaults["dns"], *values["storage"], *values["tracking"]]
    # Every pod a run makes carries the label the policy selects (the MPI operator copies the templates' labels).
    run = parse_scalingrun(yaml.safe_load((ROOT / "examples/quickstart.yaml").read_text()))
    job, mpijob = build_children(run, "ml-team-a")[1:]
    templates = [job["spec"]["template"], *(r["template"] for r in mpijob["spec"]["mpiReplicaSpecs"].values())]
    assert all(RUN_LABEL in t["metadata"]["labels"] for t in templates)


@pytest.mark.parametrize("values,message", [
    (["--set", "networkPolicy.enabled=true"], "needs the runs' namespaces: networkPolicy.namespaces"),
    (["--set", "networkPolicy.enabled=true", "--set", "networkPolicy.namespaces={ml}"],
     "needs networkPolicy.storage"),
])
def test_network_policy_refuses_to_render_without_namespaces_or_storage(helm, values, message):
    result = subprocess.run([helm, "template", "t", str(CHART), *values], capture_output=True, text=True)
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_storage_settings_reach_the_operator(helm):
    deployment = next(o for o in render(helm, CHART / "ci/networkpolicy-values.yaml") if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS"] == "http://minio.storage:9000"
    assert env["SCALINGRUN_MAX_DOCUMENT_BYTES"] == "1048576"
    default = next(o for o in render(helm) if o["kind"] == "Deployment")
    names = {e["name"] for e in default["spec"]["template"]["spec"]["containers"][0]["env"]}
    # By default no allow-list and no allow-any: the operator refuses what only its pod can reach.
    assert not names & {"SCALINGRUN_ALLOWED_STORAGE_ENDPOINTS", "SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT",
                        "SCALINGRUN_ALLOW_LOCAL_PATHS"}


def test_the_endpoint_defaults_can_be_opened_and_told_the_service_range(helm):
    deployment = next(o for o in render(helm, None, "--set", "operator.allowAnyStorageEndpoint=true",
                                        "--set", "operator.clusterServiceRanges={10.96.0.0/12}")
                      if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["SCALINGRUN_ALLOW_ANY_STORAGE_ENDPOINT"] == "true"
    assert env["SCALINGRUN_CLUSTER_SERVICE_RANGES"] == "10.96.0.0/12"
    from scalingrun_operator import config
    assert config.load({"SCALINGRUN_CLUSTER_SERVICE_RANGES": env["SCALINGRUN_CLUSTER_SERVICE_RANGES"]}).endpoint_policy(
    ).service_ranges == ("10.96.0.0/12",)
    result = subprocess.run([helm, "template", "t", str(CHART), "--set", "operator.clusterServiceRanges={10.96}"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "clusterServiceRanges" in result.stderr, result.stderr


def test_gpu_tolerations_reach_the_operator_and_bad_ones_are_refused(helm):
    from scalingrun_operator import config

    def tolerations(*extra: str) -> list[dict]:
        deployment = next(o for o in render(helm, None, *extra) if o["kind"] == "Deployment")
        env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        loaded = config.load({"SCALINGRUN_GPU_TOLERATIONS": env["SCALINGRUN_GPU_TOLERATIONS"]}).gpu_tolerations
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in loaded]

    assert tolerations() == [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                             for t in config.Config().gpu_tolerations]  # the chart's default is the operator's
    amd = [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert tolerations("--set-json", f"gpuTolerations={json.dumps(amd)}") == amd
    assert tolerations("--set-json", "gpuTolerations=[]") == []
    result = subprocess.run([helm, "template", "t", str(CHART), "--set-json", 'gpuTolerations=[{"operator": "Maybe"}]'],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "gpuTolerations" in result.stderr, result.stderr


def test_the_security_page_lists_exactly_what_the_chart_grants_the_operator(helm):
    """docs/security.md says why each grant is needed: its table and the chart must not drift apart."""
    from tests.support.rbac import bound_rules, grants

    text = (ROOT / "docs/security.md").read_text()
    table = text[text.index("| Resource | API group | Verbs |"):].split("\n\n")[0].splitlines()[2:]
    documented = set()
    for row in table:
        resource, group, verbs = (cell.strip().strip("`") for cell in row.strip("|").split("|")[:3])
        documented |= {(verb.strip(), "" if group == "core" else group, resource) for verb in verbs.split(",")}
    granted = set()
    for values in VALUES:
        objects = render(helm, values)
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        granted |= grants(bound_rules(objects, deployment["spec"]["template"]["spec"]["serviceAccountName"],
                                      "scalingrun-system"))
    assert documented == granted, (sorted(documented - granted), sorted(granted - documented))
    # The chart's README names the same resources (and leaves the verbs and the why to that table).
    readme = (CHART / "README.md").read_text()
    section = readme[readme.index("## RBAC\n"):].split("\n## ")[0]
    named = {word for word in re.findall(r"`([^`]+)`", section) if re.fullmatch(r"[a-z]+(/[a-z]+)?", word)}
    assert named == {resource for _, _, resource in granted}, (sorted(named), sorted(granted))


def test_users_who_may_edit_runs_may_not_write_their_status(helm):
    """status.pinnedSpec chooses the spec a run is held to: only the operator (the status verb) writes it."""
    roles = [o for o in render(helm) if o["kind"] == "ClusterRole"
             and (o["metadata"].get("labels") or {}).get("rbac.authorization.k8s.io/aggregate-to-edit") == "true"]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            if any(resource.endswith("/status") or resource == "*" for resource in rule["resources"]):
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


def test_the_unserved_mpijob_bound_reaches_the_operator(helm):
    def env(*args):
        deployment = next(o for o in render(helm, None, *args) if o["kind"] == "Deployment")
        return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert env()["SCALINGRUN_MPIJOB_UNSERVED_SECONDS"] == "300"
    assert env("--set", "operator.mpiJobUnservedSeconds=0")["SCALINGRUN_MPIJOB_UNSERVED_SECONDS"] == "0"  # off


def test_the_crds_carry_the_charts_version(helm):
    """What `scalingrun doctor` and the operator's start-up compare with their own version (cluster/preflight.py)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    crds = [o for o in render(helm) if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 2
    assert {crd["metadata"]["labels"]["app.kubernetes.io/version"] for crd in crds} == {chart["version"]}
