"""A store that answers like S3 and misbehaves, on 127.0.0.1: one server per behaviour (the operator's circuit
breaker is per endpoint). Raw sockets, so that headers can be trickled; every answer is made as it is sent,
never held whole (the huge error body is 200 MiB).

Behaviours:
- huge-error: 403 with a 200 MiB error body;
- trickle-headers: a status line, then one byte of headers every `pace` seconds, for as long as it is read;
- trickle-body: a document of 4 KiB, one byte every `pace` seconds;
- endless-listing: listing pages with no keys and a fresh continuation token each time; documents 404;
- redirect: 307 to `location` (the cloud metadata address unless told otherwise);
- error-text: 403 whose S3 error message holds a tab, non-ASCII characters and 10 KiB of text;
- healthy: a small JSON document whose ETag is `etag` (304 to a request that names it), for comparison.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
import uuid
from typing import Optional

HUGE = 200 * 1024 * 1024
BEHAVIOURS = ("huge-error", "trickle-headers", "trickle-body", "endless-listing", "redirect", "error-text", "healthy")


class HostileStore:
    def __init__(self, behaviour: str, pace: float = 0.2, location: str = "http://169.254.169.254/latest/meta-data/",
                 longest: float = 120.0, tls: Optional[ssl.SSLContext] = None):
        assert behaviour in BEHAVIOURS, behaviour
        self.behaviour, self.pace, self.location, self.longest, self.tls = behaviour, pace, location, longest, tls
        self.requests: list[str] = []  # each request's line and headers, in order
        self.etag = "v1"
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._accept, name=f"hostile-{behaviour}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                if self.tls:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                while not self._closing.is_set():
                    request = _read_request(conn)
                    if request is None:
                        return
                    with self._lock:
                        self.requests.append(request)
                    if not self._answer(conn, request):
                        return
            except (OSError, ssl.SSLError):  # the operator hung up: what it should do with most of these
                return

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.bytes_sent += len(data)

    def _answer(self, conn: socket.socket, request: str) -> bool:
        """Answers one request; False when the connection is done."""
        if self.behaviour == "huge-error":
            body = b"<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>" + b"x" * 65536
            self._send(conn, b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                             b"Content-Length: %d\r\n\r\n" % HUGE)
            sent = 0
            while sent < HUGE and not self._closing.is_set():
                chunk = body[:HUGE - sent]
                self._send(conn, chunk)
                sent += len(chunk)
                body = b"x" * 65536
            return False
        if self.behaviour == "trickle-headers":
            self._send(conn, b"HTTP/1.1 200 OK\r\n")
            self._trickle(conn, b"x-amz-request-id: " + b"a" * 100000)
            return False
        if self.behaviour == "trickle-body":
            self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n"
                             b"ETag: \"trickle\"\r\n\r\n")
            self._trickle(conn, b"{\"pad\": \"" + b"x" * 4084 + b"\"}")
            return False
        if self.behaviour == "endless-listing":
            if "list-type=2" in request:
                token = uuid.uuid4().hex
                body = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult><Name>b</Name><Prefix></Prefix>"
                        b"<KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
                        b"<NextContinuationToken>" + token.encode() + b"</NextContinuationToken></ListBucketResult>")
                self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                           % len(body) + body)
                return True
            body = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
            self._send(conn, b"HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                       % len(body) + body)
            return True
        if self.behaviour == "redirect":
            self._send(conn, b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + self.location.encode() +
                       b"\r\nContent-Length: 0\r\n\r\n")
            return True
        if self.behaviour == "healthy":
            if f'if-none-match: "{self.etag}"' in request.lower():
                self._send(conn, b"HTTP/1.1 304 Not Modified\r\nETag: \"%s\"\r\n\r\n" % self.etag.encode())
                return True
            body = b'{"state": "running", "epoch": 1}'
            self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: \"%s\"\r\n"
                             b"Content-Length: %d\r\n\r\n" % (self.etag.encode(), len(body)) + body)
            return True
        message = "denied – é\tX-Injected: yes ".encode() + b"y" * 10240
        body = b"<Error><Code>AccessDenied</Code><Message>" + message + b"</Message></Error>"
        self._send(conn, b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
                   % len(body) + body)
        return True

    def _trickle(self, conn: socket.socket, data: bytes) -> None:
        started = time.monotonic()
        for index in range(len(data)):
            if self._closing.is_set() or time.monotonic() - started > self.longest:
                return
            self._send(conn, data[index:index + 1])
            time.sleep(self.pace)


def _read_request(conn: socket.socket) -> Optional[str]:
    """The next request's line and headers (requests here have no body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > 1 << 20:
            return None
    return data.split(b"\r\n\r\n", 1)[0].decode("latin-1")


def self_signed(folder) -> tuple[ssl.SSLContext, str]:
    """A server context for 127.0.0.1 with a new self-signed certificate, and the certificate's PEM file."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context, str(cert_file)
