"""Whether the operator connects to the store during the e2e: its pods' TCP sockets, sampled from this host.

On the node cluster (../shared/node) the pods' processes run on this host, so the operator's are found in /proc: the
image's entrypoint as the command, a pod's environment, a network namespace other than this one. Every `interval` the sampler reads each one's
/proc/<pid>/net/tcp and tcp6 (its pod's sockets) and keeps those whose remote port is the store's: connecting
(SYN_SENT), open, or closed by the operator (TIME_WAIT, kept 60 s by the kernel). A pooled client such as the one
the operator's storage reads used keeps its connections open between reads, so a pull-mode operator shows them in
every sample. An operator counts as push mode when its environment sets the status endpoint's port (the chart does
when statusServer.enabled): the previous release in test_upgrade has no push path, and its reads are the evidence
that the sampler sees them.

A process is known by its pid and start time (/proc/<pid>/stat): a long e2e beside the integration tests wraps the
pids (pid_max 32768 by default), and an operator's pid taken over by a run's pod that reads the store is not the
operator connecting.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT",
          "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0B": "CLOSING"}  # 0A LISTEN: not a connection
OPERATOR_ENTRYPOINT = "scalingrun-operator"  # Dockerfile.operator's, this release's and the previous one's
POD_VARIABLE = b"KUBERNETES_SERVICE_HOST="  # the kubelet sets it in every pod's containers (not in a docker build)
PUSH_MODE_VARIABLE = b"SCALINGRUN_STATUS_PORT_NUMBER="


@dataclass(frozen=True)
class Connection:
    pid: int
    started: int  # the process's start time in clock ticks after boot: with the pid, which process it was
    push_mode: bool
    remote: str  # address:port
    state: str


def connections_to(port: int, proc_net: Path) -> list[tuple[str, str]]:
    """(remote address:port, state) of the sockets in `proc_net` (/proc/<pid>/net) whose remote port is `port`."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4:
                continue
            address, _, remote_port = fields[2].partition(":")
            state = STATES.get(fields[3].upper())
            if state and int(remote_port, 16) == port:
                found.append((f"{_address(address)}:{port}", state))
    return found


def _address(hex_address: str) -> str:
    """/proc's hex address (each 32-bit word in host order, little-endian here) as text."""
    words = [bytes.fromhex(hex_address[i:i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    if len(words) == 1:
        return ".".join(str(b) for b in words[0])
    raw = b"".join(words)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return ".".join(str(b) for b in raw[12:])
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


@dataclass
class StoreConnectionSampler:
    """Samples, in a thread, the store connections of every operator process in another network namespace."""
    port: int
    interval: float = 0.5
    proc: Path = Path("/proc")
    samples: int = 0
    operators: dict[tuple[int, int], bool] = field(default_factory=dict)  # (pid, start) -> push mode, of each seen
    connections: set[Connection] = field(default_factory=set)
    own_namespace: str = ""  # this process's network namespace (read at the first sample)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: Optional[threading.Thread] = None

    def start(self) -> "StoreConnectionSampler":
        self._thread = threading.Thread(target=self._loop, name="store-connections", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)

    def sample(self) -> None:
        self.own_namespace = self.own_namespace or os.readlink(self.proc / "self/ns/net")
        for pid in self._pids():
            started = self._start_time(pid)
            push_mode = self._operator(pid, started) if started is not None else None
            if push_mode is None:
                continue
            found = connections_to(self.port, self.proc / str(pid) / "net")
            if self._start_time(pid) != started:
                continue  # the operator ended while its sockets were read: they may be the next process's
            for remote, state in found:
                self.connections.add(Connection(pid, started, push_mode, remote, state))
        self.samples += 1

    def push_mode_connections(self) -> list[Connection]:
        return sorted((c for c in self.connections if c.push_mode), key=lambda c: (c.pid, c.remote, c.state))

    def summary(self) -> str:
        push = sum(1 for mode in self.operators.values() if mode)
        pulled = sorted({(c.pid, c.started, c.remote) for c in self.connections if not c.push_mode})
        return (f"store connections (port {self.port}): {self.samples} samples, every {self.interval:g} s, of "
                f"{len(self.operators)} operator processes ({push} with the status endpoint on); theirs: "
                f"{len(self.push_mode_connections())}; those without it (the previous release, or pull mode): "
                f"{len(pulled)} (process, remote) pairs")

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _pids(self) -> list[int]:
        return [int(entry.name) for entry in self.proc.iterdir() if entry.name.isdigit()]

    def _start_time(self, pid: int) -> Optional[int]:
        """The start time of process `pid` (field 22 of /proc/<pid>/stat, after the command in parentheses)."""
        try:
            return int((self.proc / str(pid) / "stat").read_text().rpartition(")")[2].split()[19])
        except (OSError, IndexError, ValueError):
            return None  # gone

    def _operator(self, pid: int, started: int) -> Optional[bool]:
        """Whether process (`pid`, `started`) is an operator in another network namespace in push mode; None when
        not an operator. Only an operator is remembered: a container's process starts as runc's, in this namespace,
        and then becomes it (the same pid and start time: exec keeps both)."""
        if (pid, started) in self.operators:
            return self.operators[(pid, started)]
        try:
            command = (self.proc / str(pid) / "cmdline").read_bytes().split(b"\0")[:2]
            if not any(os.path.basename(part.decode(errors="replace")) == OPERATOR_ENTRYPOINT for part in command):
                return None
            if os.readlink(self.proc / str(pid) / "ns/net") == self.own_namespace:
                return None  # an operator on this host (the integration tests'), not a pod's
            environment = (self.proc / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            return None  # gone
        if not any(entry.startswith(POD_VARIABLE) for entry in environment):
            return None  # a container that is no pod's
        self.operators[(pid, started)] = any(entry.startswith(PUSH_MODE_VARIABLE) and entry != PUSH_MODE_VARIABLE
                                             for entry in environment)
        return self.operators[(pid, started)]
