"""The status endpoint's own CA and serving certificate, as the operator makes and rotates them (pure: no I/O).

A Secret keeps them (cluster/certificate_secret.py): the trust bundle (ca.crt: the CA that signs now, first, and an
older CA while it is still valid), the signing CA's key (ca.key) and the serving pair (tls.crt, tls.key). `renewed`
says what a check changes, if anything:
- the serving certificate is renewed in the last third of its life (or at once when it is broken: unparseable, for
  other host names, signed by no CA of the bundle);
- the CA is renewed in the last third of its life. The new CA joins the bundle first and signs no serving certificate
  until TRUST_SETTLE has passed: the kubelet takes that long at most to update the runs' pods' copy of the bundle, so
  no pod meets a certificate its bundle cannot verify. The old CA stays in the bundle until it expires.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Optional

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_FILE, KEY_FILE, CA_FILE, CA_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key"
# Longer than the kubelet takes to refresh a ConfigMap volume (its sync period plus its cache TTL, 1 min each).
TRUST_SETTLE = dt.timedelta(minutes=10)
# Pods whose clock runs a little behind still accept a certificate made just now.
BACKDATE = dt.timedelta(minutes=5)
RENEW_FRACTION = 1 / 3  # renewed when this share of its life is left


@dataclass(frozen=True)
class Lifetimes:
    ca: dt.timedelta
    serving: dt.timedelta

    def __post_init__(self) -> None:
        # A serving certificate must end before its CA: the CA is renewed with a third of its life left.
        if not dt.timedelta(hours=1) <= self.serving <= self.ca * RENEW_FRACTION:
            raise ValueError(f"the serving certificate's life ({self.serving}) must be at least an hour and at most "
                             f"a third of the CA's ({self.ca})")


@dataclass(frozen=True)
class ServingCertificate:
    cas: tuple[x509.Certificate, ...]  # the trust bundle, the signing CA first
    ca_key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def data(self) -> dict[str, bytes]:
        """The Secret's keys (PEM)."""
        return {CA_FILE: b"".join(_pem(ca) for ca in self.cas), CA_KEY: _private_pem(self.ca_key),
                CERT_FILE: _pem(self.cert), KEY_FILE: _private_pem(self.key)}


def parse(data: Mapping[str, bytes]) -> Optional[ServingCertificate]:
    """What a Secret holds; None when it holds no usable set (missing keys, not PEM, keys that match nothing)."""
    try:
        cas = tuple(x509.load_pem_x509_certificates(data[CA_FILE]))
        ca_key = serialization.load_pem_private_key(data[CA_KEY], None)
        cert = x509.load_pem_x509_certificate(data[CERT_FILE])
        key = serialization.load_pem_private_key(data[KEY_FILE], None)
    except (KeyError, ValueError, TypeError):
        return None
    if not (isinstance(ca_key, ec.EllipticCurvePrivateKey) and isinstance(key, ec.EllipticCurvePrivateKey)):
        return None
    if cas[0].public_key() != ca_key.public_key():
        return None
    return ServingCertificate(cas, ca_key, cert, key)


def host_names(url_host: str) -> list[str]:
    """The names a pod may reach the Service by: the URL's own, and for <service>.<namespace>.svc the shorter and
    the fully qualified forms."""
    parts = url_host.split(".")
    if len(parts) == 3 and parts[2] == "svc":
        return [parts[0], ".".join(parts[:2]), url_host, f"{url_host}.cluster.local"]
    return [url_host]


def made(hosts: Iterable[str], lifetimes: Lifetimes, now: dt.datetime) -> ServingCertificate:
    """A new CA and a serving certificate it signs."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _ca(ca_key, lifetimes.ca, now)
    return _signed(ServingCertificate((ca,), ca_key, ca, ca_key), list(hosts), lifetimes.serving, now)


def renewed(current: Optional[ServingCertificate], hosts: Iterable[str], lifetimes: Lifetimes,
            now: dt.datetime) -> Optional[ServingCertificate]:
    """What the Secret should hold instead of `current`, or None when it is good as it is."""
    hosts = list(hosts)
    if current is None:
        return made(hosts, lifetimes, now)
    cas = tuple(ca for ca in current.cas if _not_after(ca) > now)
    changed = cas != current.cas  # an expired CA leaves the bundle
    if not cas or _due(cas[0], now):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        cas, changed = (_ca(ca_key, lifetimes.ca, now), *cas), True
        current = replace(current, ca_key=ca_key)
    current = replace(current, cas=cas)
    issuer = _issuer(current.cert, cas)
    if issuer is None or not _serves(current, hosts, now):
        return _signed(current, hosts, lifetimes.serving, now)  # broken: at once, by the newest CA
    if _due(current.cert, now) and now - _not_before(cas[0]) >= TRUST_SETTLE + BACKDATE:
        return _signed(current, hosts, lifetimes.serving, now)
    return current if changed else None


def _signed(current: ServingCertificate, hosts: list[str], life: dt.timedelta,
            now: dt.datetime) -> ServingCertificate:
    key = ec.generate_private_key(ec.SECP256R1())
    ca = current.cas[0]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(min(now + life, _not_after(ca)))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
            .sign(current.ca_key, hashes.SHA256()))
    return replace(current, cert=cert, key=key)


def _ca(key: ec.EllipticCurvePrivateKey, life: dt.timedelta, now: dt.datetime) -> x509.Certificate:
    # Each CA its own subject: a pod's bundle holds two during a rotation, and a certificate names its issuer.
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"scalingrun status CA {now:%Y%m%dT%H%M%S.%f}")])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - BACKDATE)
            .not_valid_after(now + life)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))


def _issuer(cert: x509.Certificate, cas: tuple[x509.Certificate, ...]) -> Optional[x509.Certificate]:
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            return ca
        except (InvalidSignature, ValueError, TypeError):  # not this one
            continue
    return None


def _serves(current: ServingCertificate, hosts: list[str], now: dt.datetime) -> bool:
    """Valid now, for every host name, with the key it names."""
    try:
        names = current.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return (_not_after(current.cert) > now and set(_names(hosts)) <= set(names)
            and current.cert.public_key() == current.key.public_key())


def _names(hosts: list[str]) -> list[x509.GeneralName]:
    """An address as an IP name (a pod given https://10.0.0.1:8443 checks that), any other host as a DNS name."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _due(cert: x509.Certificate, now: dt.datetime) -> bool:
    life = _not_after(cert) - _not_before(cert)
    return _not_after(cert) - now < life * RENEW_FRACTION


def _not_before(cert: x509.Certificate) -> dt.datetime:
    return cert.not_valid_before_utc


def _not_after(cert: x509.Certificate) -> dt.datetime:
    return cert.not_valid_after_utc


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
