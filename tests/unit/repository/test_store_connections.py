"""The e2e's sampler of the operator's store connections (tests/support/store_connections.py), on a /proc made here:
what it counts as an operator, a push-mode one, and a connection to the store."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.store_connections import StoreConnectionSampler, connections_to

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def socket_line(local: str, remote: str, state: str) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  1000        0 1 1\n"


def process(proc: Path, pid: int, command: list[str], namespace: str, environment: dict[str, str],
            tcp: str = "", tcp6: str = "", started: int = 1000) -> None:
    folder = proc / str(pid)
    (folder / "ns").mkdir(parents=True)
    (folder / "net").mkdir()
    # /proc/<pid>/stat: the start time is field 22; the command in parentheses may hold spaces and parentheses.
    (folder / "stat").write_text(f"{pid} (a (b) c) S 1 {pid} {pid} 0 -1 4194560 " + "0 " * 12 + f"{started} 1 2\n")
    (folder / "cmdline").write_bytes(b"\0".join(c.encode() for c in command) + b"\0")
    (folder / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environment.items()))
    (folder / "ns/net").symlink_to(namespace)
    (folder / "net/tcp").write_text(HEADER + tcp)
    (folder / "net/tcp6").write_text(HEADER + tcp6)


# 10.0.0.23:8333 as /proc writes it (little-endian words), and ::ffff:10.0.0.23 in tcp6.
STORE_V4, STORE_V6 = "1700000A:208D", "0000000000000000FFFF00001700000A:208D"
API_SERVER = "0100000A:01BB"  # 10.0.0.1:443


def test_a_connection_to_the_store_port_is_found_in_every_state_but_listen(tmp_path):
    net = tmp_path / "net"
    net.mkdir()
    (net / "tcp").write_text(HEADER + socket_line("0500000A:9C40", STORE_V4, "01")
                             + socket_line("0500000A:9C41", API_SERVER, "01")
                             + socket_line("0500000A:9C42", STORE_V4, "06")
                             + socket_line("00000000:208D", "00000000:0000", "0A"))
    (net / "tcp6").write_text(HEADER + socket_line("0" * 32 + ":9C43", STORE_V6, "02"))
    assert connections_to(8333, net) == [("10.0.0.23:8333", "ESTABLISHED"), ("10.0.0.23:8333", "TIME_WAIT"),
                                         ("10.0.0.23:8333", "SYN_SENT")]
    assert connections_to(9000, net) == []


def test_only_operators_in_a_pods_namespace_count_and_push_mode_comes_from_their_environment(tmp_path):
    proc = tmp_path / "proc"
    host, pod_a, pod_b, pod_c = "net:[1]", "net:[2]", "net:[3]", "net:[4]"
    (proc / "self/ns").mkdir(parents=True)
    (proc / "self/ns/net").symlink_to(host)
    store = socket_line("0500000A:9C40", STORE_V4, "01")
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    process(proc, 10, ["/usr/local/bin/python", "/usr/local/bin/scalingrun-operator", "--all-namespaces"], pod_a,
            {**pod, "SCALINGRUN_STATUS_PORT_NUMBER": "8443"}, tcp=socket_line("0500000A:9C41", API_SERVER, "01"))
    process(proc, 11, ["scalingrun-operator"], pod_b, pod, tcp=store)  # the previous release: no status endpoint
    process(proc, 12, ["/usr/local/bin/scalingrun-operator", "--standalone"], host,
            {**pod, "SCALINGRUN_STATUS_PORT_NUMBER": "8443"}, tcp=store)  # an operator on this host
    process(proc, 13, ["python", "-m", "scalingrun_trainer.cli", "train"], pod_c, pod, tcp=store)  # a run's pod
    process(proc, 14, ["/bin/sh", "-c", "pip install . && scalingrun-operator --help"], "net:[5]", {},
            tcp=store)  # a docker build's step: no pod's process
    sampler = StoreConnectionSampler(8333, proc=proc)
    sampler.sample()
    assert sampler.operators == {(10, 1000): True, (11, 1000): False}
    assert sampler.push_mode_connections() == []
    assert {(c.pid, c.push_mode, c.state) for c in sampler.connections} == {(11, False, "ESTABLISHED")}

    # The push-mode operator connects: the next sample has it.
    (proc / "10/net/tcp").write_text(HEADER + socket_line("0500000A:9C44", STORE_V4, "02"))
    sampler.sample()
    assert [(c.pid, c.remote, c.state) for c in sampler.push_mode_connections()] == [(10, "10.0.0.23:8333", "SYN_SENT")]
    assert "2 samples" in sampler.summary() and "2 operator processes (1 with the status endpoint on)" in sampler.summary()


def test_an_operators_pid_taken_over_by_a_runs_pod_is_not_the_operator_connecting(tmp_path):
    """pids wrap in a long e2e (pid_max 32768): a push-mode operator ends, and a trainer in a run's pod, reading the
    store, gets its pid. The sampler knows a process by pid and start time, so the trainer's connection is nobody's."""
    proc = tmp_path / "proc"
    (proc / "self/ns").mkdir(parents=True)
    (proc / "self/ns/net").symlink_to("net:[1]")
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    process(proc, 25282, ["/usr/local/bin/scalingrun-operator"], "net:[2]",
            {**pod, "SCALINGRUN_STATUS_PORT_NUMBER": "8443"}, started=5000)
    sampler = StoreConnectionSampler(8333, proc=proc)
    sampler.sample()
    assert sampler.operators == {(25282, 5000): True}

    shutil.rmtree(proc / "25282")
    process(proc, 25282, ["python", "-m", "scalingrun_trainer.cli", "train"], "net:[3]", pod,
            tcp=socket_line("0500000A:9C40", STORE_V4, "01"), started=912345)
    sampler.sample()
    assert sampler.push_mode_connections() == [] and sampler.connections == set()

    # The same process connecting is seen: pid and start time unchanged.
    shutil.rmtree(proc / "25282")
    process(proc, 25282, ["/usr/local/bin/scalingrun-operator"], "net:[2]",
            {**pod, "SCALINGRUN_STATUS_PORT_NUMBER": "8443"}, tcp=socket_line("0500000A:9C40", STORE_V4, "06"),
            started=5000)
    sampler.sample()
    assert [(c.pid, c.started, c.state) for c in sampler.push_mode_connections()] == [(25282, 5000, "TIME_WAIT")]
