"""The MPIJob launcher's entry: wait until every worker in the hostfile answers ssh, then run mpirun (with --logs,
as a child whose log is archived in the run's storage: run_logs; without, by exec).

A worker's DNS name appears before its sshd listens, and mpi-operator may start the launcher before the
workers are Ready (launcherCreationPolicy AtStartup, or a restarted worker): mpirun would then fail on
its first ssh. A host counts as ready when its name resolves and a TCP connection to the ssh port gets
an SSH identification line ("SSH-2.0-..."), so that only sshd itself, not any listener, satisfies it.

Standard library only: the launcher starts in well under a second (no TensorFlow import).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

DEFAULT_HOSTFILE = "/etc/mpi/hostfile"
DEFAULT_SSH_PORT = 2222
DEFAULT_TIMEOUT_SECONDS = 300.0
BANNER_PREFIX = b"SSH-"
BANNER_MAX_BYTES = 255  # RFC 4253: the identification line is at most 255 characters


class LaunchError(RuntimeError):
    """The hostfile is unusable or some workers never answered: the message says which and why."""


@dataclass(frozen=True)
class Probe:
    host: str
    ready: bool
    problem: str = ""


def read_hostfile(path: str) -> list[str]:
    """Host names in order, without duplicates: `name slots=N` (mpi-operator v0.8) or `name` (v0.3)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise LaunchError(f"hostfile {path} not found: the MPI operator mounts it into the launcher "
                          "(/etc/mpi/hostfile); outside an MPIJob pass --hostfile") from None
    hosts: list[str] = []
    for line in lines:
        fields = line.split("#", 1)[0].split()
        if fields and fields[0] not in hosts:
            hosts.append(fields[0])
    if not hosts:
        raise LaunchError(f"hostfile {path} names no hosts")
    return hosts


def probe(host: str, port: int, timeout: float) -> Probe:
    """One attempt: resolve the name, connect, read the SSH identification line."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return Probe(host, False, f"no DNS name ({exc.strerror})")
    problem = "no address"
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                banner = _read_line(sock)
        except ConnectionRefusedError:
            problem = f"connection refused on port {port} (sshd not listening yet)"
            continue
        except OSError as exc:  # timeouts included
            problem = f"cannot connect to port {port}: {exc.strerror or exc}"
            continue
        if banner.startswith(BANNER_PREFIX):
            return Probe(host, True)
        shown = banner[:40].decode("ascii", "replace").strip() or "nothing"
        problem = f"port {port} answered without an SSH banner (got {shown!r}): is sshd what listens there?"
    return Probe(host, False, problem)


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < BANNER_MAX_BYTES:
        chunk = sock.recv(BANNER_MAX_BYTES - len(data))
        if not chunk:
            break
        data += chunk
    return data


def wait_for_hosts(hosts: list[str], port: int, timeout: float, *, interval: float = 1.0,
                   log: Callable[[str], None] = lambda line: None) -> float:
    """Probes every not-yet-ready host each round until all answer; returns the seconds waited.

    Raises LaunchError at the deadline, naming each host still missing with its last problem."""
    started = time.monotonic()
    deadline = started + timeout
    waiting = {host: "not probed yet" for host in hosts}
    reported: dict[str, str] = {}
    while True:
        for host in list(waiting):
            remaining = deadline - time.monotonic()
            result = probe(host, port, timeout=max(0.1, min(2.0, remaining)))
            if result.ready:
                del waiting[host]
            else:
                waiting[host] = result.problem
                if reported.get(host) != result.problem:  # log changes only, not every round
                    log(f"waiting for {host}: {result.problem}")
                    reported[host] = result.problem
        if not waiting:
            return time.monotonic() - started
        if time.monotonic() >= deadline:
            missing = "; ".join(f"{host}: {problem}" for host, problem in waiting.items())
            raise LaunchError(
                f"{len(waiting)} of {len(hosts)} workers not reachable over ssh after {timeout:.0f} s: {missing}. "
                "Check the worker pods (kubectl describe pod / kubectl logs) for why sshd is not up")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


class _Stopped(Exception):
    def __init__(self, number: int):
        super().__init__(number)
        self.number, self.name = number, signal.Signals(number).name


def _stop(number: int, _frame: object) -> None:
    raise _Stopped(number)


def launch(command: list[str], hostfile: str = DEFAULT_HOSTFILE, port: int = DEFAULT_SSH_PORT,
           timeout: float = DEFAULT_TIMEOUT_SECONDS, logs: Optional[str] = None) -> int:
    """Waits for the workers, then runs `command` (mpirun). With `logs` (a URI: the run's `<runLocation>/logs`) it runs
    as a child whose output is archived there when the attempt ends (run_logs); without, it replaces this process."""
    archive = None
    if logs:
        from .run_logs import AttemptArchive

        archive = AttemptArchive(logs)

    def log(line: str) -> None:
        text = f"scalingrun-trainer launch: {line}"
        if archive is None:
            print(text, file=sys.stderr, flush=True)
        else:
            archive.note(text)

    def failed(code: int) -> int:
        if archive is not None:
            archive.finish(code)
        return code

    if not command:
        log("error: no command to run after the workers are up (usage: launch [options] -- mpirun ...)")
        return 2
    if archive is not None:  # claims the attempt's number now: a launcher killed later still leaves its record
        flushing = archive.start_flushing()
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # as PID 1, unhandled ones are ignored
            signal.signal(number, _stop)
    try:
        hosts = read_hostfile(hostfile)
        log(f"waiting up to {timeout:.0f} s for {len(hosts)} workers' sshd on port {port}")
        waited = wait_for_hosts(hosts, port, timeout, log=log)
    except LaunchError as exc:
        log(f"error: {exc}")
        return failed(3)
    except _Stopped as stopped:
        log(f"{stopped.name} received while waiting for the workers")
        if archive is not None:
            archive.finish(128 + stopped.number, stopped.name)
        return 128 + stopped.number
    # The whole command line: a run's log then shows what every rank was started with (our trainer or the team's).
    log(f"all {len(hosts)} workers answer ssh after {waited:.1f} s; starting {shlex.join(command)}")
    if archive is not None:
        from .run_logs import run_archived

        flushing.set()
        return run_archived(command, archive)
    try:
        os.execvp(command[0], command)  # replaces this process; comes back only by raising
    except OSError as exc:
        log(f"error: cannot start {command[0]}: {exc.strerror or exc}")
    return 127
