"""The chart's monitoring, off by default: the PrometheusRule's alerts and the Grafana dashboard read only metrics the
operator exports (docs/operations.md, "Metrics"), and each has its toggle."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from scalingrun_operator.cluster.metrics import Metrics
from tests.support.chart import CHART, helm, render  # noqa: F401 (fixtures)
from tests.support.env import require

DASHBOARD = CHART / "dashboards/scalingrun.json"
# PromQL words that are not metric names: operators, and the modifiers between them.
PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def populated_metrics() -> Metrics:
    """The operator's registry with a sample in every family: a run whose status has every per-run field."""
    metrics = Metrics()
    metrics.observe_run("u", "Training", body={"metadata": {"namespace": "ns", "name": "r"}, "status": {
        "conditions": [{"type": "Stalled", "status": "True"}],
        "training": {"epoch": 1, "maxEpochs": 2, "imagesPerSecond": 1.0, "inputWaitFraction": 0.1, "restarts": 0,
                     "gpuHours": 0.1, "processHours": 0.1, "heartbeat": {"time": "2026-01-01T00:00:00Z"},
                     "interruptions": {"podDeleted": 0}}}})
    metrics.api_errors.labels(code="500").inc()
    metrics.push_errors.labels(what="status").inc()
    metrics.reconciles.labels(kind="run").inc()
    metrics.reconcile_errors.labels(handler="create").inc()
    metrics.child_create_seconds.labels(kind="Job").observe(0.1)
    metrics.run_to_child_seconds.labels(kind="Job").observe(1)
    metrics.events.labels(type="Normal", reason="Training").inc()
    metrics.watch_queue("triggers", lambda: 0)
    metrics.preflight_problem.labels(check="mpijob-api").set(0)
    return metrics


def exported_metric_names(per_run: bool = False) -> set[str]:
    """Every sample name the operator serves; with `per_run`, those labelled with a run only."""
    metrics = populated_metrics()
    return {sample.name for family in metrics.registry.collect() for sample in family.samples
            if not per_run or "run" in sample.labels}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once label matchers, grouping labels, ranges,
    strings, numbers, functions and operators are taken out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", expr)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?!\s*\()\b", expr))
    functions = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*\(", expr))
    return {name for name in names - functions if name.lower() not in PROMQL_WORDS}


def test_the_promql_reader_finds_the_metrics_and_nothing_else():
    """The check itself: it must see a metric name wherever PromQL can put one, and nothing that is not one."""
    assert metric_names('max by (namespace, run) (a_b{c="d"}) == 1 or time() - x > 5 and on (run) y{q=~"t|u"}') \
        == {"a_b", "x", "y"}
    assert metric_names("histogram_quantile(0.95, sum by (le) (rate(h_bucket[5m])))") == {"h_bucket"}
    assert metric_names("(max(leader{namespace=\"ns\"}) or vector(0)) < 1") == {"leader"}


def test_off_by_default(helm):
    kinds = [(o["kind"], o["metadata"]["name"]) for o in render(helm)]
    assert not [k for k in kinds if k[0] == "PrometheusRule" or k[1].endswith("-dashboard")]


@pytest.mark.parametrize("toggle,kind", [("metrics.prometheusRule.enabled", "PrometheusRule"),
                                         ("metrics.grafanaDashboard.enabled", "ConfigMap")])
def test_each_toggle_adds_its_object_alone_and_needs_the_metrics(helm, toggle, kind):
    before = [(o["kind"], o["metadata"]["name"]) for o in render(helm)]
    after = [(o["kind"], o["metadata"]["name"]) for o in render(helm, None, "--set", f"{toggle}=true")]
    assert [k for k in after if k not in before] == [
        (kind, "t-scalingrun" if kind == "PrometheusRule" else "t-scalingrun-dashboard")]
    refused = subprocess.run([helm, "template", "t", str(CHART), "--set", f"{toggle}=true",
                              "--set", "metrics.enabled=false"], capture_output=True, text=True)
    assert refused.returncode != 0 and "needs metrics.enabled" in refused.stderr


def test_the_alerts_read_only_exported_metrics(helm):
    rule = next(o for o in render(helm, CHART / "ci/monitoring-values.yaml") if o["kind"] == "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    rules = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert set(rules) == {"ScalingRunStalled", "ScalingRunOperatorWithoutLeader", "ScalingRunOperatorQueueBackingUp"}
    exported = exported_metric_names()
    for alert, body in rules.items():
        read = metric_names(body["expr"])
        assert read, f"{alert} reads no metric"
        assert read <= exported, f"{alert} reads metrics the operator does not export: {read - exported}"
    assert 'scalingrun_leader{namespace="scalingrun-system"}' in rules["ScalingRunOperatorWithoutLeader"]["expr"]
    tuned = next(o for o in render(helm, CHART / "ci/monitoring-values.yaml",
                                   "--set", "metrics.prometheusRule.queueDepth=7") if o["kind"] == "PrometheusRule")
    assert "> 7" in tuned["spec"]["groups"][0]["rules"][2]["expr"]


def dashboard_queries(dashboard: dict) -> list[str]:
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            queries.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query))
    return queries


def test_the_dashboard_is_valid_json_that_reads_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "scalingrun" and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    exported = exported_metric_names()
    queries = dashboard_queries(dashboard)
    read = set().union(*(metric_names(q) for q in queries))
    assert read <= exported, f"the dashboard reads metrics the operator does not export: {read - exported}"
    per_run = exported_metric_names(per_run=True)
    assert per_run <= read, f"per-run series without a panel: {per_run - read}"
    for query in queries:
        for variable in re.findall(r"\$(\w+)", query):
            assert variable in variables | {"__all"}, f"{query} uses an undefined variable ${variable}"


def test_the_dashboard_configmap_carries_the_file(helm):
    configmap = next(o for o in render(helm, CHART / "ci/monitoring-values.yaml")
                     if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "t-scalingrun-dashboard")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["scalingrun.json"]) == json.loads(DASHBOARD.read_text())


def test_the_operations_page_names_every_exported_metric_and_no_other():
    families = {family.name + ("_total" if family.type == "counter" else ""): family.type
                for family in populated_metrics().registry.collect()}
    page = (CHART.parents[1] / "docs/operations.md").read_text().split("## Metrics and alerts", 1)[1]
    rows = dict(re.findall(r"^\| `(scalingrun_\w+)` \| (\w+) \|", page, flags=re.M))
    assert rows == families


def test_the_alerts_fire_on_what_they_name_and_not_otherwise(helm, tmp_path):
    """The rendered alerts evaluated by Prometheus' own rule tester (promtool, Debian's prometheus package) over
    series as the operator exports them: a stalled run and a silent one fire, a run that beats does not; no leader
    (a leader gone, or none scraped at all) fires; a deep queue fires after 10 minutes."""
    promtool = shutil.which("promtool")
    require(promtool is not None, "needs promtool (apt-get install prometheus; scripts/setup.sh installs it)")
    rule = next(o for o in render(helm, None, "--set", "metrics.prometheusRule.enabled=true")
                if o["kind"] == "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for body in group["rules"]:
            body.pop("annotations")  # their wording is not under test; promtool would compare it
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    system = 'namespace="scalingrun-system"'
    cases = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": [
            {"series": 'scalingrun_run_condition{namespace="a", run="stuck", condition="Stalled"}', "values": "1x60"},
            {"series": 'scalingrun_run_phase{namespace="a", run="silent", phase="Training"}', "values": "1x60"},
            {"series": 'scalingrun_run_heartbeat_timestamp_seconds{namespace="a", run="silent"}', "values": "0x60"},
            {"series": 'scalingrun_run_phase{namespace="a", run="beating", phase="Training"}', "values": "1x60"},
            {"series": 'scalingrun_run_heartbeat_timestamp_seconds{namespace="a", run="beating"}',
             "values": "0+60x60"},
            {"series": 'scalingrun_run_phase{namespace="a", run="done", phase="Succeeded"}', "values": "1x60"},
            {"series": 'scalingrun_run_heartbeat_timestamp_seconds{namespace="a", run="done"}', "values": "0x60"},
            {"series": f'scalingrun_leader{{{system}, pod="p1"}}', "values": "1x10 0x50"},
            {"series": f'scalingrun_queue_depth{{{system}, queue="triggers"}}', "values": "500x60"},
            {"series": f'scalingrun_queue_depth{{{system}, queue="followed"}}', "values": "9000x60"}],
         "alert_rule_test": [
            {"eval_time": "20m", "alertname": "ScalingRunStalled", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "namespace": "a", "run": "stuck"}}]},
            {"eval_time": "40m", "alertname": "ScalingRunStalled", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "namespace": "a", "run": "stuck"}},
                {"exp_labels": {"severity": "warning", "namespace": "a", "run": "silent"}}]},
            {"eval_time": "12m", "alertname": "ScalingRunOperatorWithoutLeader", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "ScalingRunOperatorWithoutLeader",
             "exp_alerts": [{"exp_labels": {"severity": "critical"}}]},
            {"eval_time": "5m", "alertname": "ScalingRunOperatorQueueBackingUp", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "ScalingRunOperatorQueueBackingUp", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "namespace": "scalingrun-system", "queue": "triggers"}}]}]},
        {"interval": "1m", "input_series": [], "alert_rule_test": [  # no operator scraped at all
            {"eval_time": "10m", "alertname": "ScalingRunOperatorWithoutLeader",
             "exp_alerts": [{"exp_labels": {"severity": "critical"}}]}]}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases))
    checked = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert tested.returncode == 0, tested.stdout + tested.stderr
