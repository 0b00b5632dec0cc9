"""The launcher's wait for the workers' sshd, against real TCP servers on loopback addresses.

Every host listens on the same port, as workers do, on its own address of 127.0.0.0/8: 127.0.0.1 speaks
an SSH identification line, 127.0.0.2 answers something else, nothing listens on 127.0.0.3.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from scalingrun_trainer.launch.mpirun import LaunchError, probe, read_hostfile, wait_for_hosts
from tests.support.launcher import (  # noqa: F401 (port: a fixture)
    ABSENT_HOST, OTHER_HOST, SSH_HOST, UNRESOLVABLE, port, tcp_server, write_hostfile,
)


def test_hostfile_formats_of_mpi_operator_v08_and_v03(tmp_path):
    v08 = write_hostfile(tmp_path, ["pi-worker-0.pi.ns.svc slots=2", "pi-worker-1.pi.ns.svc slots=2"])
    assert read_hostfile(v08) == ["pi-worker-0.pi.ns.svc", "pi-worker-1.pi.ns.svc"]
    v03 = write_hostfile(tmp_path, ["# workers", "", "pi-worker-0.pi-worker", "pi-worker-1.pi-worker  # second",
                                    "pi-worker-0.pi-worker"])
    assert read_hostfile(v03) == ["pi-worker-0.pi-worker", "pi-worker-1.pi-worker"]


def test_hostfile_missing_or_empty_is_a_clear_error(tmp_path):
    with pytest.raises(LaunchError, match=r"hostfile .*/absent not found: .*--hostfile"):
        read_hostfile(str(tmp_path / "absent"))
    with pytest.raises(LaunchError, match="names no hosts"):
        read_hostfile(write_hostfile(tmp_path, ["# nothing here", ""]))


def test_waits_until_a_late_sshd_answers(port):
    with tcp_server(SSH_HOST, port, b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", start_after=1.5):
        lines: list[str] = []
        waited = wait_for_hosts([SSH_HOST], port, timeout=20, interval=0.2, log=lines.append)
    assert 1.5 <= waited < 10
    assert lines == [f"waiting for {SSH_HOST}: connection refused on port {port} (sshd not listening yet)"]


def test_deadline_names_each_missing_host_and_why(port):
    hosts = [SSH_HOST, OTHER_HOST, ABSENT_HOST, UNRESOLVABLE]
    started = time.monotonic()
    with tcp_server(SSH_HOST, port, b"SSH-2.0-test\r\n"), tcp_server(OTHER_HOST, port, b"HTTP/1.1 400 Bad Request\r\n"):
        with pytest.raises(LaunchError) as failure:
            wait_for_hosts(hosts, port, timeout=2, interval=0.2)
    assert time.monotonic() - started < 10
    message = str(failure.value)
    assert message.startswith("3 of 4 workers not reachable over ssh after 2 s: ")
    reasons = dict(part.split(": ", 1) for part in message.split(" after 2 s: ", 1)[1].split(". Check")[0].split("; "))
    assert set(reasons) == {OTHER_HOST, ABSENT_HOST, UNRESOLVABLE}
    assert reasons[OTHER_HOST].startswith(f"port {port} answered without an SSH banner (got 'HTTP/1.1 400 Bad Request')")
    assert reasons[ABSENT_HOST] == f"connection refused on port {port} (sshd not listening yet)"
    assert reasons[UNRESOLVABLE].startswith("no DNS name (")


def test_a_listener_that_closes_without_a_banner_is_not_sshd(port):
    with tcp_server(SSH_HOST, port, b""):
        result = probe(SSH_HOST, port, timeout=1)
    assert not result.ready
    assert result.problem == f"port {port} answered without an SSH banner (got 'nothing'): is sshd what listens there?"


def run_launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalingrun_trainer.cli", "launch", *args],
                          capture_output=True, text=True, timeout=60)


def test_launch_execs_the_command_once_every_worker_answers(tmp_path, port):
    hostfile = write_hostfile(tmp_path, [f"{SSH_HOST} slots=1"])
    with tcp_server(SSH_HOST, port, b"SSH-2.0-test\r\n"):
        result = run_launch("--hostfile", hostfile, "--ssh-port", str(port), "--timeout", "10", "--",
                            sys.executable, "-c", "import sys; print('mpirun stand-in', sys.argv[1:])", "-np", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "mpirun stand-in ['-np', '2']\n"
    assert f"waiting up to 10 s for 1 workers' sshd on port {port}" in result.stderr
    assert "all 1 workers answer ssh after " in result.stderr
    assert "; starting " + sys.executable + " -c 'import sys; print(" in result.stderr  # the whole command line


def test_launch_fails_at_the_deadline_without_running_the_command(tmp_path, port):
    hostfile = write_hostfile(tmp_path, [f"{ABSENT_HOST} slots=1"])
    marker = tmp_path / "ran"
    result = run_launch("--hostfile", hostfile, "--ssh-port", str(port), "--timeout", "1", "--",
                        "touch", str(marker))
    assert result.returncode == 3
    assert f"error: 1 of 1 workers not reachable over ssh after 1 s: {ABSENT_HOST}: connection refused" in result.stderr
    assert not marker.exists()


def test_launch_without_a_command_is_a_usage_error(tmp_path):
    result = run_launch("--hostfile", write_hostfile(tmp_path, ["w0"]))
    assert result.returncode == 2 and "no command to run" in result.stderr


def test_launcher_imports_no_tensorflow():
    code = ("import sys, scalingrun_trainer.cli; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'horovod', 'numpy', 'kopf'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
