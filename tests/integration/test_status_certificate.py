"""The operator-kept serving certificate (cluster/certificate_secret.py) against a real kube-apiserver: one Secret
made once, adopted by a second replica, renewed near expiry by one replica only, the new CA published to the runs'
namespaces (status_config.py) before it signs, and made again from what is served when the Secret is deleted."""

from __future__ import annotations

import base64
import datetime as dt
import threading
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client

from scalingrun_api.status_push import CA_FILE, STATUS_CONFIG_MAP
from scalingrun_operator.cluster.certificate_secret import CertificateSecret
from scalingrun_operator.cluster.status_config import StatusConfigMaps
from scalingrun_operator.serving_certificate import CERT_FILE, KEY_FILE, TRUST_SETTLE, Lifetimes, host_names

pytestmark = pytest.mark.k8s

SECRET = "scalingrun-status-tls"
URL_HOST = "scalingrun-status.scalingrun-system.svc"
LIFE = Lifetimes(ca=dt.timedelta(days=30), serving=dt.timedelta(days=10))


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        return self.now

    def forward(self, delta: dt.timedelta) -> None:
        self.now += delta


def _replica(api_client, namespace: str, folder: Path, clock: Clock) -> CertificateSecret:
    return CertificateSecret(api_client, namespace, SECRET, host_names(URL_HOST), LIFE, str(folder), clock)


def _secret(api_client, namespace: str) -> client.V1Secret:
    return client.CoreV1Api(api_client).read_namespaced_secret(SECRET, namespace)


def _files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in (CA_FILE, CERT_FILE, KEY_FILE)}


def _in_secret(secret: client.V1Secret) -> dict[str, bytes]:
    return {name: base64.b64decode(secret.data[name]) for name in (CA_FILE, CERT_FILE, KEY_FILE)}


def _cas(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def test_one_secret_is_made_and_every_replica_serves_it(api_client, namespace, tmp_path):
    clock = Clock()
    first, second = (_replica(api_client, namespace, tmp_path / name, clock) for name in ("a", "b"))
    assert first.ensure() is True
    made = _secret(api_client, namespace)
    assert made.type == "kubernetes.io/tls"
    assert made.metadata.labels == {"app.kubernetes.io/managed-by": "scalingrun-operator"}  # no Helm/Argo CD owner
    assert second.ensure() is True  # adopted: its files written, the Secret not
    after = _secret(api_client, namespace)
    assert after.metadata.resource_version == made.metadata.resource_version
    assert _files(tmp_path / "a") == _files(tmp_path / "b") == _in_secret(after)
    assert oct((tmp_path / "b" / KEY_FILE).stat().st_mode & 0o777) == "0o600"
    assert first.ensure() is False and second.ensure() is False  # nothing due: nothing read back changes


def test_two_replicas_starting_together_end_with_the_same_certificate(api_client, namespace, tmp_path):
    clock = Clock()
    replicas = [_replica(api_client, namespace, tmp_path / str(n), clock) for n in range(4)]
    start = threading.Barrier(len(replicas))
    errors: list[BaseException] = []

    def race(replica: CertificateSecret) -> None:
        start.wait()
        try:
            replica.ensure()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(r,)) for r in replicas]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    held = _in_secret(_secret(api_client, namespace))
    # The creates that lost (409) read again and adopted the winner's: every replica serves the one Secret.
    assert [_files(tmp_path / str(n)) for n in range(4)] == [held] * 4


def test_renewal_near_expiry_is_done_once_and_the_new_ca_is_published_before_it_signs(api_client, namespace,
                                                                                      tmp_path, request):
    core = client.CoreV1Api(api_client)
    clock = Clock()
    leader, standby = (_replica(api_client, namespace, tmp_path / name, clock) for name in ("leader", "standby"))
    leader.ensure()
    standby.ensure()
    # The runs' namespace gets the bundle the leader serves with (status_config.py reads it from its folder).
    config_maps = StatusConfigMaps(api_client, f"https://{URL_HOST}:8443", str(tmp_path / "leader"))
    request.addfinalizer(config_maps.stop)  # its ConfigMap watch, which would outlive the test's API server
    config_maps.ensure(namespace)
    first_ca = _cas((tmp_path / "leader" / CA_FILE).read_bytes())

    # Day 7: the serving certificate (10 days) has less than a third left. Renewed under the same CA, once.
    clock.forward(dt.timedelta(days=7))
    served = _files(tmp_path / "leader")[CERT_FILE]
    assert leader.ensure() is True
    renewed = _secret(api_client, namespace)
    assert _files(tmp_path / "leader")[CERT_FILE] != served
    assert _cas(_files(tmp_path / "leader")[CA_FILE]) == first_ca
    assert standby.ensure() is True  # adopts the renewal, does not renew again
    assert _secret(api_client, namespace).metadata.resource_version == renewed.metadata.resource_version
    assert _files(tmp_path / "standby") == _files(tmp_path / "leader")

    # Day 21: the CA (30 days) has 9 left. A new CA joins the bundle, published to the namespace at once; the
    # serving certificate (due again) stays signed by the old CA until the new one has settled in the pods.
    clock.forward(dt.timedelta(days=7))
    leader.ensure()
    clock.forward(dt.timedelta(days=7))
    served = _files(tmp_path / "leader")[CERT_FILE]
    assert leader.ensure() is True
    config_maps.publish_again()
    bundle = _cas(core.read_namespaced_config_map(STATUS_CONFIG_MAP, namespace).data[CA_FILE].encode())
    assert len(bundle) == 2 and bundle[1] == first_ca[0] and bundle[0] != first_ca[0]
    assert _files(tmp_path / "leader")[CERT_FILE] == served
    x509.load_pem_x509_certificate(served).verify_directly_issued_by(first_ca[0])

    clock.forward(TRUST_SETTLE)
    assert leader.ensure() is True
    x509.load_pem_x509_certificate(_files(tmp_path / "leader")[CERT_FILE]).verify_directly_issued_by(bundle[0])
    assert standby.ensure() is True and _files(tmp_path / "standby") == _files(tmp_path / "leader")


def test_a_deleted_secret_is_made_again_from_what_is_served(api_client, namespace, tmp_path):
    clock = Clock()
    leader = _replica(api_client, namespace, tmp_path / "leader", clock)
    leader.ensure()
    served = _files(tmp_path / "leader")
    client.CoreV1Api(api_client).delete_namespaced_secret(SECRET, namespace)
    assert leader.ensure() is False  # the same files: the pods' trust does not change
    assert _in_secret(_secret(api_client, namespace)) == served
