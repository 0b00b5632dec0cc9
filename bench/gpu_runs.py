"""bench/gpu.py's runs of our trainer: the launcher (mpirun or an MPI singleton), one training run read from its
progress document, the 2-rank NCCL probe and the frozen-rank measurement; each launcher in its own process session,
stopped with every rank it started."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [str(ROOT / "operator"), str(ROOT / "trainer")]
TIMEOUT_VARIABLE = "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS"


def trainer_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([*SOURCES, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "LITLOGGER_DISABLE_TIP": "1", **extra}


STARTED = time.monotonic()


def say(message: str) -> None:
    """Progress on stderr, with the seconds since the start (the table goes to stdout)."""
    print(f"[gpu.py {time.monotonic() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def launcher(processes: int, env: dict[str, str]) -> list[str]:
    """mpirun -np N (Open MPI's flags: root allowed, no binding, the variables the ranks need); one process without
    mpirun runs as an MPI singleton."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        if processes > 1:
            raise RuntimeError("no mpirun on PATH: 2 ranks need one")
        return []
    command = [mpirun, "-np", str(processes)]
    if "Open MPI" in subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout:
        command += [*(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--bind-to", "none", "--oversubscribe"]
        for name in ("PYTHONPATH", "PYTHONUNBUFFERED", "LD_LIBRARY_PATH", "OPAL_PREFIX", "CUDA_VISIBLE_DEVICES",
                     TIMEOUT_VARIABLE):
            if name in env:
                command += ["-x", name]
    return command


def trainer_command(config: Path, processes: int, env: dict[str, str]) -> list[str]:
    return [*launcher(processes, env), sys.executable, "-m", "scalingrun_trainer.cli", "train", "--config", str(config)]


def rank_error(log: str) -> str:
    """A failed run's own last words: the last exception line of the log (mpirun's footer says only that a rank
    exited), else the log's end."""
    errors = [line.strip() for line in log.splitlines()
              if re.match(r"(\[rank\d+\]: )?\s*[\w.]*(Error|Exception|Interrupt)\b.*:", line)]
    return errors[-1][:600] if errors else log[-1500:]


def train(folder: Path, config: Path, name: str, limit: float, **env: str) -> dict:
    """One run; the progress document's figures."""
    from scalingrun_api.progress import PROGRESS_FILE, Progress

    log = folder / f"{name}.log"
    env = trainer_env(**{"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0"), **env})
    start = time.monotonic()
    with log.open("w") as out:
        job = subprocess.Popen(trainer_command(config, 1, env), stdout=out, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        code = job.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"still running after {limit:.0f} s (--run-limit): {log.read_text()[-1000:]}") from None
    finally:
        _stop(job)
    progress_file = folder / "runs" / name / PROGRESS_FILE
    if code or not progress_file.exists():
        text = log.read_text()
        if os.environ.get("OUT"):  # the whole log comes back with the table
            shutil.copy(log, Path(os.environ["OUT"], log.name))
        raise RuntimeError(f"exit {code}: {rank_error(text)}")
    progress = Progress.read(json.loads(progress_file.read_text()))
    rates = [epoch.images_per_second for epoch in progress.history if epoch.images_per_second]
    cache = progress.feature_cache
    return {"rate": statistics.median(rates[1:] or rates), "epochs": rates, "wall": time.monotonic() - start,
            "input_wait": progress.input_wait_fraction, "gpu_utilization": progress.gpu_utilization,
            "cache_used": bool(cache and cache.used), "cache_seconds": cache.seconds if cache else None}


NCCL_PAIR = """
import os, sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("nccl", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
torch.cuda.set_device(0)
value = torch.ones(1, device="cuda:0") * (rank + 1)
dist.all_reduce(value)
torch.cuda.synchronize()
print("sum", value.item())
dist.destroy_process_group()
"""


def nccl_pair() -> tuple[bool, str]:
    """Can two NCCL ranks share cuda:0? (NCCL refuses it: 'Duplicate GPU detected'.)"""
    with tempfile.TemporaryDirectory() as scratch:
        store = os.path.join(scratch, "store")
        ranks = [subprocess.Popen([sys.executable, "-c", NCCL_PAIR, str(rank), store], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=trainer_env(NCCL_DEBUG="WARN"))
                 for rank in (0, 1)]
        outputs = []
        for rank in ranks:
            try:
                outputs.append(rank.communicate(timeout=90)[0])
            except subprocess.TimeoutExpired:
                rank.kill()
                outputs.append((rank.communicate()[0] or "") + "\n(no answer in 90 s)")
    if all(rank.returncode == 0 for rank in ranks):
        return True, "a 2-rank NCCL all-reduce on cuda:0 worked"
    lines = [line.strip() for output in outputs for line in output.splitlines()]
    why = ([line for line in lines if "Duplicate GPU" in line] + [line for line in lines if re.match(
        r"^[\w.]*(Error|Exception)\b.*:", line)] + [line for line in lines if "NCCL WARN" in line] + lines[-1:])
    return False, (why[0] if why else "no output")[:300]


def _rank_process(session: int, rank: int) -> int | None:
    """The pid of `rank` among the launcher's processes (Open MPI's, MPICH's or torch's rank variable)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session:
                continue
            variables = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, ValueError):
            continue
        if "scalingrun_trainer.cli" in (entry / "cmdline").read_text(errors="replace") and str(rank) in (
                variables.get("OMPI_COMM_WORLD_RANK"), variables.get("PMI_RANK"), variables.get("RANK")):
            return int(entry.name)
    return None


def frozen_rank(folder: Path, config: Path, name: str, timeout: int, limit: float, hidden_cuda: bool) -> dict:
    """2 ranks; after epoch 1 and half an epoch more, SIGSTOP rank 1; seconds until the launcher exits."""
    from scalingrun_api.progress import PROGRESS_FILE, Progress

    env = trainer_env(**{TIMEOUT_VARIABLE: str(timeout), "CUDA_VISIBLE_DEVICES": "" if hidden_cuda else
                  os.environ.get("CUDA_VISIBLE_DEVICES", "0")})
    log = folder / f"{name}.log"
    progress_file = folder / "runs" / name / PROGRESS_FILE
    with log.open("w") as out:
        job = subprocess.Popen(trainer_command(config, 2, env), stdout=out, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        deadline, seen = time.monotonic() + 600, []  # (epochs finished, when seen)
        while len(seen) < 2:  # two finished epochs: training runs, and an epoch's length is known
            if job.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"exit {job.returncode} before epoch 2 ended: {log.read_text()[-1500:]}")
            time.sleep(0.2)
            try:
                epochs = len(Progress.read(json.loads(progress_file.read_text())).history)
            except (OSError, ValueError):
                continue  # not there yet, or being written
            if epochs and (not seen or epochs > seen[-1][0]):
                seen.append((epochs, time.monotonic()))
        time.sleep((seen[1][1] - seen[0][1]) / (seen[1][0] - seen[0][0]) / 2)  # half an epoch on
        pid = _rank_process(job.pid, 1)
        if pid is None:
            raise RuntimeError("rank 1's process not found")
        os.kill(pid, signal.SIGSTOP)
        say(f"rank 1 (pid {pid}) stopped; waiting for the launcher to exit (at most {limit:.0f} s)")
        stopped = time.monotonic()
        try:
            code = job.wait(timeout=limit)
            seconds = time.monotonic() - stopped
        except subprocess.TimeoutExpired:
            code, seconds = None, limit
        lines = [line.strip() for line in log.read_text().splitlines() if line.strip()]
        ours = [line for line in lines if line.startswith("scalingrun-trainer (rank")]  # the ranks' own words
        return {"exit": code, "seconds": seconds, "limit": limit, "timeout": timeout,
                "tail": (ours[0][:300] if ours else " / ".join(lines[-3:])[-300:])}
    finally:
        _stop(job)


def _stop(job: subprocess.Popen) -> None:
    """The launcher and every rank it started (its own process session), stopped ones too."""
    for sent in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(job.pid, sent)
        except ProcessLookupError:
            break
    job.wait()
