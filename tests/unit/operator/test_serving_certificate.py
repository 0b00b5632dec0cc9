"""The operator-made CA and serving certificate (serving_certificate.py): made, kept while good, renewed in the last
third of their life, a new CA trusted before it signs, a broken set replaced at once."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509

from scalingrun_operator.serving_certificate import (
    CA_FILE, CERT_FILE, TRUST_SETTLE, Lifetimes, host_names, made, parse, renewed,
)

HOSTS = host_names("t-scalingrun-status.scalingrun-system.svc")
LIFE = Lifetimes(ca=dt.timedelta(days=30), serving=dt.timedelta(days=10))
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


def _days(n: float) -> dt.datetime:
    return T0 + dt.timedelta(days=n)


def _names(cert: x509.Certificate) -> list[str]:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)


def test_the_service_names_a_pod_may_use_are_all_in_the_certificate():
    assert HOSTS == ["t-scalingrun-status", "t-scalingrun-status.scalingrun-system",
                     "t-scalingrun-status.scalingrun-system.svc",
                     "t-scalingrun-status.scalingrun-system.svc.cluster.local"]
    first = made(HOSTS, LIFE, T0)
    first.cert.verify_directly_issued_by(first.cas[0])
    assert _names(first.cert) == HOSTS
    assert parse(first.data()).data() == first.data()  # what the Secret holds reads back as it was
    assert renewed(first, HOSTS, LIFE, _days(1)) is None  # good: nothing to write


def test_the_serving_certificate_is_renewed_in_the_last_third_of_its_life_under_the_same_ca():
    first = made(HOSTS, LIFE, T0)
    assert renewed(first, HOSTS, LIFE, _days(6)) is None
    second = renewed(first, HOSTS, LIFE, _days(7))
    assert second is not None and second.cert != first.cert
    assert second.data()["tls.key"] != first.data()["tls.key"]
    assert second.cas == first.cas  # the pods' trust does not change
    second.cert.verify_directly_issued_by(first.cas[0])


def test_a_new_ca_is_trusted_first_and_signs_only_once_the_pods_have_it():
    current = made(HOSTS, LIFE, T0)
    for day in (7, 14):
        current = renewed(current, HOSTS, LIFE, _days(day))
    old_ca = current.cas[0]
    # Day 21: the CA has 9 of its 30 days left. A new CA joins the bundle; the serving certificate (due as well,
    # 3 of 10 days left) waits for it to settle.
    staged = renewed(current, HOSTS, LIFE, _days(21))
    assert staged is not None and staged.cas[1:] == (old_ca,) and staged.cas[0] != old_ca
    assert staged.cert == current.cert
    assert renewed(staged, HOSTS, LIFE, _days(21) + TRUST_SETTLE / 2) is None
    settled = renewed(staged, HOSTS, LIFE, _days(21) + TRUST_SETTLE)
    assert settled is not None and settled.cas == staged.cas
    settled.cert.verify_directly_issued_by(staged.cas[0])
    # The old CA leaves the bundle when it expires (day 30), the new one stays.
    later = renewed(settled, HOSTS, LIFE, _days(30.5))
    assert later is not None and later.cas == (staged.cas[0],)


def test_a_broken_set_is_replaced_at_once():
    first = made(HOSTS, LIFE, T0)
    other_hosts = renewed(first, host_names("other-status.ns.svc"), LIFE, _days(1))
    assert other_hosts is not None and "other-status.ns.svc" in _names(other_hosts.cert)
    expired = renewed(first, HOSTS, LIFE, _days(10.5))
    assert expired is not None and expired.cert.not_valid_after_utc > _days(10.5)
    assert parse({**first.data(), CERT_FILE: b"not PEM"}) is None
    assert parse({k: v for k, v in first.data().items() if k != CA_FILE}) is None
    assert renewed(None, HOSTS, LIFE, T0) is not None  # nothing usable: a new set


def test_a_serving_certificate_may_not_outlive_a_third_of_its_ca():
    with pytest.raises(ValueError, match="third of the CA"):
        Lifetimes(ca=dt.timedelta(days=30), serving=dt.timedelta(days=11))
