"""The chart's part of the push path: the status endpoint's Service, port and certificate (kept by the operator, or
cert-manager's; a render the same every time), the TokenReview grant and the NetworkPolicies that let the runs'
pods reach it (docs/security.md, "The push path")."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.chart import CHART, helm, render  # noqa: F401 (fixtures)

STATUS = CHART / "ci/status-values.yaml"
# The operator's grant for its own certificate (cluster/certificate_secret.py): create cannot be limited by name.
CERTIFICATE_RULES = [
    ("Role", "t-scalingrun-status-certificate", {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
    ("Role", "t-scalingrun-status-certificate", {"apiGroups": [""], "resources": ["secrets"],
                                                 "resourceNames": ["t-scalingrun-status-tls"],
                                                 "verbs": ["get", "update"]}),
]


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


def test_the_default_install_is_the_push_path_and_names_one_secret_only(helm):
    """Issue 40's promise for the install one gets with no values at all, the status endpoint on, kept with the
    operator-made certificate (issue 52): the only rule of the chart that reaches Secrets is the operator's for its
    own certificate, by name in its namespace (and create, which no name can limit)."""
    objects = render(helm)
    assert {"SCALINGRUN_STATUS_PORT_NUMBER", "SCALINGRUN_STATUS_URL"} <= {
        e["name"] for e in _operator_container(objects)["env"]}
    assert _one(objects, "Service", "t-scalingrun-status")
    assert _secret_rules(objects) == CERTIFICATE_RULES


def test_two_renders_are_byte_identical(helm):
    """What Argo CD and `helm template` do on every sync: nothing random in a render (no genCA), so a sync changes
    nothing and the runs' pods keep trusting the endpoint. With cert-manager too."""
    for extra in ((), ("--set", "statusServer.certManager.enabled=true")):
        args = [helm, "template", "t", str(CHART), "--namespace", "scalingrun-system", *extra]
        first, second = (subprocess.run(args, capture_output=True, text=True, check=True).stdout for _ in "12")
        assert first == second and "kind: Deployment" in first
    # lookup renders empty without a cluster, so two `helm template` runs agree even with it; but Argo CD's render
    # would then differ from `helm install`'s. No template asks the cluster, the clock or chance.
    calls = re.compile(r"\b(lookup|genCA|genSignedCert|genSelfSignedCert|genPrivateKey|randAlphaNum|randAlpha|"
                       r"randNumeric|randAscii|uuidv4|now)\b")
    for template in sorted((CHART / "templates").rglob("*")):
        if template.suffix in (".yaml", ".tpl", ".txt"):
            code = "".join(re.findall(r"{{(.*?)}}", template.read_text(), re.S))
            assert not calls.findall(code), template.name


def test_pull_mode_is_the_opt_out_and_grants_secrets_get(helm):
    """statusServer.enabled=false still renders: no status Service, certificate or settings, and the operator's
    role gets Secrets (the run's storage keys, get only) to read the runs' stores."""
    objects = render(helm, None, "--set", "statusServer.enabled=false")
    assert not [o for o in objects if o["metadata"]["name"].endswith(("-status", "-status-tls", "-status-push"))]
    env = {e["name"]: e.get("value") for e in _operator_container(objects)["env"]}
    assert "SCALINGRUN_STATUS_PORT_NUMBER" not in env and env["SCALINGRUN_PULL_DOCUMENTS"] == "true"  # chosen, explicit
    assert [(kind, name, rule["verbs"]) for kind, name, rule in _secret_rules(objects)] == [
        ("ClusterRole", "t-scalingrun-operator", ["get"])]


def test_the_status_endpoint_serves_on_its_own_port_with_a_certificate_the_operator_keeps(helm):
    objects = render(helm, STATUS)
    service = _one(objects, "Service", "t-scalingrun-status")
    assert service["spec"]["ports"] == [{"name": "status", "port": 8443, "targetPort": "status", "protocol": "TCP"}]
    container = _operator_container(objects)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SCALINGRUN_STATUS_PORT_NUMBER"] == "8443"
    assert env["SCALINGRUN_STATUS_URL"] == "https://t-scalingrun-status.scalingrun-system.svc:8443"
    assert {"name": "status", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    # No certificate rendered: the operator keeps it in this Secret and writes its files into a memory folder.
    assert not [o for o in objects if o["kind"] in ("Secret", "Certificate")]
    assert (env["SCALINGRUN_STATUS_TLS_SECRET"], env["SCALINGRUN_STATUS_CA_DAYS"],
            env["SCALINGRUN_STATUS_CERTIFICATE_DAYS"]) == ("t-scalingrun-status-tls", "3650", "365")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "status-tls")
    assert mount["mountPath"] == env["SCALINGRUN_STATUS_TLS_DIR"] and mount["readOnly"] is False
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {"name": "status-tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}} in pod["volumes"]
    binding = _one(objects, "RoleBinding", "t-scalingrun-status-certificate")
    assert binding["roleRef"]["name"] == "t-scalingrun-status-certificate"
    assert binding["metadata"]["namespace"] == "scalingrun-system"


def test_a_serving_certificate_longer_than_a_third_of_its_ca_is_refused(helm):
    with pytest.raises(subprocess.CalledProcessError) as refused:
        render(helm, STATUS, "--set", "statusServer.caDays=30", "--set", "statusServer.certificateDays=11")
    assert "at most a third of statusServer.caDays" in refused.value.stderr


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
    assert certificate["spec"]["duration"] == "8760h"
    assert not [o for o in objects if o["kind"] in ("Secret", "Issuer")]
    # The kubelet mounts cert-manager's Secret; the operator keeps none and gets no grant on Secrets.
    env = {e["name"] for e in _operator_container(objects)["env"]}
    assert "SCALINGRUN_STATUS_TLS_SECRET" not in env and _secret_rules(objects) == []
    pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {"name": "status-tls", "secret": {"secretName": "t-scalingrun-status-tls"}} in pod["volumes"]


def test_cert_manager_without_an_issuer_gets_the_charts_own_ca_issuer(helm):
    objects = render(helm, STATUS, "--set", "statusServer.certManager.enabled=true")
    selfsigned = _one(objects, "Issuer", "t-scalingrun-status-selfsigned")
    assert selfsigned["spec"] == {"selfSigned": {}}
    ca = _one(objects, "Certificate", "t-scalingrun-status-ca")
    assert ca["spec"]["isCA"] is True and ca["spec"]["issuerRef"] == {"kind": "Issuer",
                                                                      "name": "t-scalingrun-status-selfsigned"}
    ca_issuer = _one(objects, "Issuer", "t-scalingrun-status-ca")
    assert ca_issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    serving = _one(objects, "Certificate", "t-scalingrun-status-tls")
    assert serving["spec"]["issuerRef"] == {"kind": "Issuer", "name": "t-scalingrun-status-ca"}
    assert "t-scalingrun-status.scalingrun-system.svc" in serving["spec"]["dnsNames"]


def test_with_the_status_endpoint_the_operator_may_review_tokens_label_its_pod_and_keep_its_certificate(helm):
    from tests.support.rbac import bound_rules, grants

    account = "t-scalingrun"
    without, with_status = (grants(bound_rules(render(helm, values, *extra), account, "scalingrun-system"))
                            for values, extra in ((STATUS, ("--set", "statusServer.enabled=false")), (STATUS, ())))
    # TokenReviews, the serving replica's label on its own pod (cluster/serving.py), the status ConfigMap's watch
    # (by name; deleted and made again when a tenant made it immutable: cluster/status_config.py), and its
    # certificate's Secret (create; get and update by name: CERTIFICATE_RULES).
    assert with_status - without == {("create", "authentication.k8s.io", "tokenreviews"), ("patch", "", "pods"),
                                     ("list", "", "configmaps"), ("watch", "", "configmaps"),
                                     ("delete", "", "configmaps"), ("create", "", "secrets"), ("update", "", "secrets")}
    # The storage keys' get on every Secret: no storage read any more; what is left of get is the one name.
    assert without - with_status == set()
    assert _secret_rules(render(helm, STATUS)) == CERTIFICATE_RULES


@pytest.mark.parametrize("kind, profile", [
    ("ClusterRole", ("--set", "watch.namespaces=null", "--set", "networkPolicy.enabled=false")),  # cluster-wide
    ("Role", ("--set", "watch.namespaces={ml-team-a,ml-team-b}")),  # the namespaced profile: a Role per namespace
])
def test_with_the_status_endpoint_no_role_of_the_chart_reaches_another_secret(helm, kind, profile):
    objects = render(helm, STATUS, *profile)
    roles = [o for o in objects if o["kind"] in ("ClusterRole", "Role")]
    assert [o["kind"] for o in roles if o["metadata"]["name"] == "t-scalingrun-operator"] == (
        ["Role", "Role"] if kind == "Role" else ["ClusterRole"])
    # Not the operator's role, nor any other: only its certificate's Secret, by name, in its own namespace.
    assert _secret_rules(objects) == CERTIFICATE_RULES
    assert _one(objects, "Role", "t-scalingrun-status-certificate")["metadata"]["namespace"] == "scalingrun-system"
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
