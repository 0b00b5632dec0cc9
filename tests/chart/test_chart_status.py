"""The chart's part of the push path: the status endpoint's Service, port and certificate, the TokenReview grant and
the NetworkPolicies that let the runs' pods reach it (docs/security.md, "The push path")."""

from __future__ import annotations

import base64

import pytest

from cryptography import x509

from tests.support.chart import CHART, helm, render  # noqa: F401 (fixtures)

STATUS = CHART / "ci/status-values.yaml"


def _one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _operator_container(objects: list[dict]) -> dict:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _secret_rules(objects: list[dict]) -> list[tuple[str, str, dict]]:
    """(kind, name, rule) for every rule of any Role or ClusterRole that reaches Secrets."""
    return [(o["kind"], o["metadata"]["name"], rule) for o in objects if o["kind"] in ("ClusterRole", "Role")
            for rule in o.get("rules") or [] if {"secrets", "*"} & set(rule.get("resources", []))]


def test_the_default_install_is_the_push_path_and_no_role_names_secrets(helm):
    """Issue 40's promise for the install one gets with no values at all: the status endpoint on, and no role of
    the chart (the operator's or any other) that can reach a Secret."""
    objects = render(helm)
    assert {"SCALINGRUN_STATUS_PORT_NUMBER", "SCALINGRUN_STATUS_URL"} <= {
        e["name"] for e in _operator_container(objects)["env"]}
    assert _one(objects, "Service", "t-scalingrun-status")
    assert _secret_rules(objects) == []


def test_pull_mode_is_the_opt_out_and_grants_secrets_get(helm):
    """statusServer.enabled=false still renders: no status Service, certificate or settings, and the operator's
    role gets Secrets (the run's storage keys, get only) to read the runs' stores."""
    objects = render(helm, None, "--set", "statusServer.enabled=false")
    assert not [o for o in objects if o["metadata"]["name"].endswith(("-status", "-status-tls", "-status-push"))]
    assert "SCALINGRUN_STATUS_PORT_NUMBER" not in {e["name"] for e in _operator_container(objects)["env"]}
    assert [(kind, name, rule["verbs"]) for kind, name, rule in _secret_rules(objects)] == [
        ("ClusterRole", "t-scalingrun-operator", ["get"])]


def test_the_status_endpoint_serves_on_its_own_port_with_a_certificate_the_kubelet_mounts(helm):
    objects = render(helm, STATUS)
    service = _one(objects, "Service", "t-scalingrun-status")
    assert service["spec"]["ports"] == [{"name": "status", "port": 8443, "targetPort": "status", "protocol": "TCP"}]
    container = _operator_container(objects)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SCALINGRUN_STATUS_PORT_NUMBER"] == "8443"
    assert env["SCALINGRUN_STATUS_URL"] == "https://t-scalingrun-status.scalingrun-system.svc:8443"
    assert {"name": "status", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "status-tls")
    assert mount["mountPath"] == env["SCALINGRUN_STATUS_TLS_DIR"] and mount["readOnly"] is True
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {"name": "status-tls", "secret": {"secretName": "t-scalingrun-status-tls"}} in pod["volumes"]

    # The chart-made certificate: signed by the CA whose ca.crt the operator hands the runs' pods, for the Service.
    secret = _one(objects, "Secret", "t-scalingrun-status-tls")
    assert secret["type"] == "kubernetes.io/tls"
    cert, ca = (x509.load_pem_x509_certificate(base64.b64decode(secret["data"][k])) for k in ("tls.crt", "ca.crt"))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert "t-scalingrun-status.scalingrun-system.svc" in names


def test_the_status_service_sends_pushes_to_the_serving_replica_only(helm):
    """Only the leader runs the endpoint: the Service selects the pod label the serving replica sets on itself
    (cluster/serving.py), from its own name and namespace, with a grant to patch pods in its namespace only."""
    from scalingrun_operator.cluster.serving import SERVING, SERVING_LABEL

    objects = render(helm, STATUS)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    selector = _one(objects, "Service", "t-scalingrun-status")["spec"]["selector"]
    assert selector == {**deployment["spec"]["selector"]["matchLabels"], SERVING_LABEL: SERVING}
    assert SERVING_LABEL not in deployment["spec"]["template"]["metadata"]["labels"]  # set by the operator, not here
    env = {e["name"]: e.get("valueFrom") for e in _operator_container(objects)["env"]}
    assert env["SCALINGRUN_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["SCALINGRUN_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    role = _one(objects, "Role", "t-scalingrun-status-endpoint")
    assert role["metadata"]["namespace"] == "scalingrun-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    binding = _one(objects, "RoleBinding", "t-scalingrun-status-endpoint")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pull = render(helm, CHART / "ci/pull-values.yaml")
    assert not [o for o in pull if o["metadata"]["name"] == "t-scalingrun-status-endpoint"]


def test_cert_manager_makes_the_certificate_when_asked(helm):
    objects = render(helm, STATUS, "--set", "statusServer.certManager.enabled=true",
                     "--set", "statusServer.certManager.issuerRef.name=ca-issuer")
    certificate = _one(objects, "Certificate", "t-scalingrun-status-tls")
    assert certificate["spec"]["secretName"] == "t-scalingrun-status-tls"
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": "ca-issuer"}
    assert not [o for o in objects if o["kind"] == "Secret"]


def test_with_the_status_endpoint_the_operator_may_review_tokens_label_its_pod_and_read_no_secret(helm):
    from tests.support.rbac import bound_rules, grants

    account = "t-scalingrun"
    without, with_status = (grants(bound_rules(render(helm, values, *extra), account, "scalingrun-system"))
                            for values, extra in ((STATUS, ("--set", "statusServer.enabled=false")), (STATUS, ())))
    # TokenReviews, the serving replica's label on its own pod (cluster/serving.py), and the status ConfigMap's
    # watch (by name; deleted and made again when a tenant made it immutable: cluster/status_config.py).
    assert with_status - without == {("create", "authentication.k8s.io", "tokenreviews"), ("patch", "", "pods"),
                                     ("list", "", "configmaps"), ("watch", "", "configmaps"),
                                     ("delete", "", "configmaps")}
    assert without - with_status == {("get", "", "secrets")}  # the storage keys: no storage read any more


@pytest.mark.parametrize("kind, profile", [
    ("ClusterRole", ("--set", "watch.namespaces=null", "--set", "networkPolicy.enabled=false")),  # cluster-wide
    ("Role", ("--set", "watch.namespaces={ml-team-a,ml-team-b}")),  # the namespaced profile: a Role per namespace
])
def test_with_the_status_endpoint_no_role_of_the_chart_names_secrets(helm, kind, profile):
    objects = render(helm, STATUS, *profile)
    roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
    assert [o["kind"] for o in roles if o["metadata"]["name"] == "t-scalingrun-operator"] == (
        ["Role", "Role"] if kind == "Role" else ["ClusterRole"])
    # Not the operator's, nor any other: the serving certificate's Secret is mounted by the kubelet.
    assert _secret_rules(objects) == []
    # The same rules without the status endpoint do grant it: what the test looks for is there to find.
    pulling = render(helm, STATUS, *profile, "--set", "statusServer.enabled=false")
    assert any("secrets" in rule.get("resources", []) for o in pulling if o["kind"] == kind
               for rule in o.get("rules") or [])


def test_the_runs_pods_may_reach_the_status_port_from_the_runs_namespaces_only(helm):
    objects = render(helm, STATUS)
    runs = _one(objects, "NetworkPolicy", "t-scalingrun-runs")
    operator_pods = next(o for o in objects if o["kind"] == "Deployment")["spec"]["selector"]["matchLabels"]
    to_operator = [rule for rule in runs["spec"]["egress"] if rule.get("ports") == [{"port": 8443, "protocol": "TCP"}]]
    assert to_operator == [{"to": [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "scalingrun-system"}},
        "podSelector": {"matchLabels": operator_pods}}], "ports": [{"port": 8443, "protocol": "TCP"}]}]
    operator = _one(objects, "NetworkPolicy", "t-scalingrun-operator")
    status_rule = next(r for r in operator["spec"]["ingress"] if {"port": "status", "protocol": "TCP"} in r["ports"])
    # The runs' namespace by its name (the API server's label), any pod there: a pod label is the tenant's to forge.
    assert status_rule["from"] == [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml-team-a"]}]}}]
