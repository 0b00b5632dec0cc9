"""What a tenant's reach into the operator is, as the chart renders it (issue 51, items 4-6; docs/security.md):
`pods create` only with elastic.capacityProbes and then only in the runs' namespaces where they are named; the status
ConfigMap watched by name only; /metrics on the pod's IP, open to the monitoring namespace only; the status port open
to the runs' namespaces by their names (which no tenant can change), not by pod labels (which any tenant sets)."""

from __future__ import annotations

import subprocess

import pytest

from scalingrun_api.status_push import STATUS_CONFIG_MAP
from scalingrun_operator import config as config_module
from tests.support.chart import CHART, helm, render  # noqa: F401 (fixtures)
from tests.support.rbac import bound_rules, grants

ACCOUNT, HOME = "t-scalingrun", "scalingrun-system"
NAMESPACED = ("--set", "watch.namespaces={ml-team-a,ml-team-b}")
PROBES_ON = ("--set", "elastic.capacityProbes=true")
POD_CREATE = ("create", "", "pods")


def _env(objects: list[dict]) -> dict[str, dict]:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def _settings(objects: list[dict]) -> config_module.Config:
    """The operator's settings from the rendered variables that have a value (not the downward API's)."""
    return config_module.load({name: e["value"] for name, e in _env(objects).items()
                               if name.startswith("SCALINGRUN_") and "value" in e})


def _pod_create_by_namespace(objects: list[dict]) -> dict[str, bool]:
    """Whether the operator may create pods: cluster-wide ("*", its ClusterRoleBindings) and in each namespace where
    a RoleBinding binds it."""
    cluster_wide = [o for o in objects if o["kind"] != "RoleBinding"]
    out = {"*": POD_CREATE in grants(bound_rules(cluster_wide, ACCOUNT, HOME))}
    for namespace in {o["metadata"]["namespace"] for o in objects if o["kind"] == "RoleBinding"}:
        scoped = [o for o in objects if o["kind"] in ("Role", "ClusterRole")
                  or o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == namespace]
        out[namespace] = POD_CREATE in grants(bound_rules(scoped, ACCOUNT, HOME))
    return out


# --- item 5: pods create only for capacity probes, only where runs are ------------------------------------------


@pytest.mark.parametrize("profile", [(), NAMESPACED], ids=["cluster-wide", "namespaced"])
def test_by_default_the_operator_creates_no_pod_and_makes_no_probe(helm, profile):
    objects = render(helm, None, *profile)
    assert not any(_pod_create_by_namespace(objects).values())
    assert not [o for o in objects if o["kind"] == "PriorityClass"]
    settings = _settings(objects)
    assert settings.capacity_probe_priority_class == ""  # the operator says CapacityProbesOff on a shrunk run
    assert settings.max_capacity_probes == 4


def test_capacity_probes_grant_pods_create_in_the_named_namespaces_only(helm):
    objects = render(helm, None, *NAMESPACED, *PROBES_ON, "--set", "elastic.maxProbesPerRun=2")
    assert _pod_create_by_namespace(objects) == {"*": False, "ml-team-a": True, "ml-team-b": True, HOME: False}
    (priority_class,) = [o for o in objects if o["kind"] == "PriorityClass"]
    settings = _settings(objects)
    assert settings.capacity_probe_priority_class == priority_class["metadata"]["name"]
    assert settings.max_capacity_probes == 2
    # Cluster-wide (no namespace named): the ClusterRole has to carry it.
    assert _pod_create_by_namespace(render(helm, None, *PROBES_ON))["*"]


def test_probes_per_run_are_bounded_by_the_values_schema(helm):
    result = subprocess.run([helm, "template", "t", str(CHART), "--set", "elastic.maxProbesPerRun=0"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "maxProbesPerRun" in result.stderr


# --- item 4: the status ConfigMap, by name ----------------------------------------------------------------------


def test_the_operator_lists_watches_and_deletes_only_the_status_configmap(helm):
    rules = bound_rules(render(helm, None, *NAMESPACED), ACCOUNT, HOME)
    by_verb = {verb: [r.get("resourceNames") for r in rules if "configmaps" in r["resources"] and verb in r["verbs"]]
               for verb in ("list", "watch", "delete")}
    # One rule per Role (two namespaces), each naming the one ConfigMap.
    assert by_verb == {verb: [[STATUS_CONFIG_MAP]] * 2 for verb in by_verb}


# --- item 6: /metrics and the status port -----------------------------------------------------------------------


def _operator_policy(objects: list[dict]) -> dict:
    (policy,) = [o for o in objects
                 if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "t-scalingrun-operator"]
    assert policy["metadata"]["namespace"] == HOME and policy["spec"]["policyTypes"] == ["Ingress"]
    return policy


def _rule_for(policy: dict, port: str) -> dict:
    (rule,) = [r for r in policy["spec"]["ingress"] if {"port": port, "protocol": "TCP"} in r["ports"]]
    assert len(rule["ports"]) == 1, f"the {port} port shares no rule"
    return rule


def test_metrics_listen_on_the_pods_ip_open_to_the_monitoring_namespace_only(helm):
    objects = render(helm)
    assert _env(objects)["SCALINGRUN_METRICS_BIND_ADDRESS"] == {
        "name": "SCALINGRUN_METRICS_BIND_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    policy = _operator_policy(objects)
    assert _rule_for(policy, "metrics")["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert "from" not in _rule_for(policy, "health")  # the kubelet's probes come from the node
    chosen = render(helm, None, "--set", "metrics.bindAddress=127.0.0.1",
                    "--set", "networkPolicy.operator.metricsNamespaceSelector.matchLabels.team=observability")
    assert _settings(chosen).metrics_bind_address == "127.0.0.1"
    assert _rule_for(_operator_policy(chosen), "metrics")["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring", "team": "observability"}}}]
    assert {r["ports"][0]["port"] for r in _operator_policy(render(helm, None, "--set", "metrics.enabled=false"))[
        "spec"]["ingress"]} == {"status", "health"}


def test_a_metrics_bind_address_that_is_no_address_is_refused(helm):
    result = subprocess.run([helm, "template", "t", str(CHART), "--set", "metrics.bindAddress=everywhere"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "bindAddress" in result.stderr
    with pytest.raises(config_module.ConfigError, match="METRICS_BIND_ADDRESS"):
        config_module.load({"SCALINGRUN_METRICS_BIND_ADDRESS": "localhost"})


def test_the_status_port_admits_the_runs_namespaces_by_name_and_no_pod_label(helm):
    rule = _rule_for(_operator_policy(render(helm, None, *NAMESPACED)), "status")
    assert rule["from"] == [{"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml-team-a", "ml-team-b"]}]}}]
    # Cluster-wide, the runs' namespaces are not known: any namespace, and TokenReview with ownership decide.
    assert _rule_for(_operator_policy(render(helm)), "status")["from"] == [{"namespaceSelector": {}}]
    assert "podSelector" not in str(rule)
    # Pull mode has no status port to open.
    pulled = _operator_policy(render(helm, None, "--set", "statusServer.enabled=false"))
    assert {r["ports"][0]["port"] for r in pulled["spec"]["ingress"]} == {"metrics", "health"}
