"""The launcher tests' helpers: real TCP servers on loopback addresses standing in for workers' sshd, hostfiles.

Every host listens on the same port, as workers do, on its own address of 127.0.0.0/8: 127.0.0.1 speaks
an SSH identification line, 127.0.0.2 answers something else, nothing listens on 127.0.0.3.
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

SSH_HOST, OTHER_HOST, ABSENT_HOST = "127.0.0.1", "127.0.0.2", "127.0.0.3"
UNRESOLVABLE = "worker-9.no-such-job.invalid"  # RFC 2606: never resolves


@contextmanager
def tcp_server(host: str, port: int, greeting: bytes, start_after: float = 0.0):
    """A listener that sends `greeting` to every connection (starting `start_after` seconds from now)."""
    stop, listening = threading.Event(), threading.Event()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def serve():
        if stop.wait(start_after):
            return
        listener.bind((host, port))
        listener.listen()
        listener.settimeout(0.1)
        listening.set()
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            with conn:
                conn.sendall(greeting)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    if not start_after:
        assert listening.wait(5)
    try:
        yield
    finally:
        stop.set()
        thread.join()
        listener.close()


@pytest.fixture
def port() -> int:
    """A port free on all three addresses (the kernel picks one on 127.0.0.1)."""
    with socket.socket() as probe:
        probe.bind((SSH_HOST, 0))
        return probe.getsockname()[1]


def write_hostfile(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "hostfile"
    path.write_text("\n".join(lines) + "\n")
    return str(path)
