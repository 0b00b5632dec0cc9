"""`bench/operator_scale.py --push`: the push path at scale, against the pull path it replaces, on a real
kube-apiserver.

Each mode gets a fresh API server, SeaweedFS and operator (bench/operator_scale.py's `environment`), the same runs and
pods: --small-runs runs of --small-workers workers and one run of --big-workers workers, their launcher and worker
pods created by the script as the MPI operator would (no kubelet). Then, every --interval seconds, each run reports
a new epoch:
- push (the operator with its status endpoint on, as the chart starts it): the run's first --pushers pods, each with
  a token from the TokenRequest API bound to it (as the kubelet projects it), POST to the status endpoint over HTTPS:
  rank 0 the progress document with the new epoch, the others a heartbeat;
- pull (the baseline, today's default): the script writes the run's progress.json to storage, which the operator
  polls.
Measured, per mode: the lag from a report to the run's status showing its epoch (the script's own watch), p50/p95
over every report; the operator's CPU and peak RSS; API requests by the operator (the API server's counter minus
the script's own, counted client-side) while reporting and at rest (nothing reported for --rest-seconds).
Push mode then repeats the reporting beside the attackers of bench/push_attackers.py (each kind paced to at most
--hostile-rate a second): one sends garbage tokens at the healthy runs' paths, the other, with its own pod's valid
token, pushes for hundreds of made-up run names, for a victim's name (the first healthy run), and floods its own
run's path; the healthy runs' push and lag with them against without them, and whether anything of theirs was
stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import ssl
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from kubernetes import client, watch

from scalingrun_api import models
from scalingrun_api.status_push import HEARTBEAT, PROGRESS, STATUS_AUDIENCE, push_path
from scalingrun_operator.cluster.k8s import released
from tests.support.apiserver import free_port
from tests.support.operator import leave_manifest_in_a_pod, new_run, progress, progress_uri
from tests.support.tls import write_serving_certificate

from bench import pod_scale, push_attackers

POOL = 16
MAX_EPOCHS = 10000  # the runs never finish while the script reports epochs
FORGED_EPOCH = MAX_EPOCHS - 1  # what the attacker pushes for its victim: no healthy report reaches it


class EpochWatch:
    """Watches the runs of a namespace; `reported(run, epoch, at)` notes a report, and the first status event showing
    that epoch (or a later one) gives its lag."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str):
        self.custom, self.namespace = custom, namespace
        self._lock = threading.Lock()
        self._pending: dict[str, list[tuple[int, float]]] = {}
        self._epochs: dict[str, int] = {}
        self.lags: list[float] = []
        self._stopped = False
        self._watch = watch.Watch()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stopped:  # a dropped watch starts again (see pod_scale.StatusWatch)
            try:
                for event in self._watch.stream(self.custom.list_namespaced_custom_object, models.GROUP,
                                                models.VERSION, self.namespace, models.PLURAL, timeout_seconds=3600):
                    obj = event["object"]
                    epoch = ((obj.get("status") or {}).get("training") or {}).get("epoch")
                    if epoch is not None:
                        self._seen(obj["metadata"]["name"], int(epoch), time.monotonic())
            except Exception:  # noqa: BLE001 - the API server stops under the watch at the end
                time.sleep(0.5)
            self._watch = watch.Watch()

    def _seen(self, run: str, epoch: int, now: float) -> None:
        with self._lock:
            self._epochs[run] = max(epoch, self._epochs.get(run, 0))
            pending = self._pending.get(run, [])
            self.lags.extend(now - at for e, at in pending if e <= epoch)
            self._pending[run] = [(e, at) for e, at in pending if e > epoch]

    def reported(self, run: str, epoch: int, at: float) -> None:
        with self._lock:
            self._pending.setdefault(run, []).append((epoch, at))

    def take(self, settle: float) -> tuple[list[float], int]:
        """The lags noted since the last take, after waiting up to `settle` s for the pending; and how many reports
        the status never showed within it."""
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(self._pending.values()):
            time.sleep(0.2)
        with self._lock:
            lags, self.lags = self.lags, []
            missed = sum(len(p) for p in self._pending.values())
            self._pending = {}
        return lags, missed

    def epoch(self, run: str) -> int:
        with self._lock:
            return self._epochs.get(run, 0)

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


class Pusher:
    """One pod of a run that pushes: rank 0 its progress, the others a heartbeat; `source`: its address (a pod's IP:
    the status endpoint limits new tokens per source address, operator/scalingrun_operator/push_admission.py)."""

    def __init__(self, run: str, pod: str, rank: int, token: str, source: str = "127.0.0.1"):
        self.run, self.pod, self.rank, self.token, self.source = run, pod, rank, token, source


def pod_address(index: int) -> str:
    """A loopback address of its own for the index-th pushing pod (Linux routes 127.0.0.0/8 to lo)."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


def _created(core: client.CoreV1Api, namespace: str, body: dict) -> dict:
    response = core.create_namespaced_pod(namespace, body, _preload_content=False)
    created = json.loads(response.data)
    response.release_conn()
    return created


def bound_token(core: client.CoreV1Api, namespace: str, pod: dict) -> str:
    """A token of our audience bound to `pod`, as the kubelet's projected volume gets it (TokenRequest)."""
    return core.create_namespaced_service_account_token("default", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[STATUS_AUDIENCE], expiration_seconds=3600,
                                       bound_object_ref=client.V1BoundObjectReference(
                                           kind="Pod", api_version="v1", name=pod["metadata"]["name"],
                                           uid=pod["metadata"]["uid"])))).status.token


def prepare(bench: Any, cluster: Any, operator: Any, runs: dict[str, int], pushers: int, push: bool,
            create_all: Callable[..., None]) -> list[Pusher]:
    """Creates `runs` (name -> workers), drives each to Training with its pods created (push: the manifest from the
    Job's pod; pull: from storage), and returns the pods that push, each with its bound token (push mode)."""
    core, names = bench.core, list(runs)
    pod_scale.default_service_account(core, cluster.ns)
    with ThreadPoolExecutor(POOL) as pool:
        list(pool.map(lambda n: cluster.create_run(new_run(
            cluster.ns, n, bench.storage, training={"maxEpochs": MAX_EPOCHS},
            workers={"replicas": runs[n]})), names))
    _wait(operator, lambda: {f"{n}-preprocess" for n in names} <= {
        j.metadata.name for j in bench.batch.list_namespaced_job(cluster.ns).items}, "every run's Job")

    def preprocessed(name: str) -> None:
        if push:
            leave_manifest_in_a_pod(cluster, cluster.job(f"{name}-preprocess"), cluster.run(name))
            cluster.complete_job(f"{name}-preprocess", succeeded=2)
        else:
            bench.finish_preprocessing(cluster, name)

    with ThreadPoolExecutor(POOL) as pool:
        list(pool.map(preprocessed, names))
    _wait(operator, lambda: {f"{n}-train" for n in names} <= {m["metadata"]["name"] for m in bench.custom.
          list_namespaced_custom_object("kubeflow.org", "v2beta1", cluster.ns, "mpijobs")["items"]}, "every MPIJob")
    mpijobs = {n: cluster.mpijob(f"{n}-train") for n in names}
    with ThreadPoolExecutor(POOL) as pool:
        list(pool.map(lambda n: cluster.set_mpijob_condition(f"{n}-train", "Running", "MPIJobRunning", "running"),
                      names))
    work = [(n, "launcher", f"{n}-train-launcher-abcde", -1) for n in names] + [
        (n, "worker", f"{n}-train-worker-{i}", i) for n in names for i in range(runs[n])]

    def create(item: tuple[str, str, str, int]) -> Optional[Pusher]:
        run, role, name, rank = item
        body = pod_scale.training_pod(mpijobs[run], role, name)
        if not push or not 0 <= rank < pushers:
            released(core.create_namespaced_pod(cluster.ns, body, _preload_content=False))
            return None
        return Pusher(run, name, rank, bound_token(core, cluster.ns, _created(core, cluster.ns, body)))

    with ThreadPoolExecutor(POOL) as pool:
        found = [p for p in pool.map(create, work) if p is not None]
    for index, pusher in enumerate(found):
        pusher.source = pod_address(index)
    _wait(operator, lambda: sum(1 for r in bench.custom.list_namespaced_custom_object(
        models.GROUP, models.VERSION, cluster.ns, models.PLURAL)["items"]
        if (r.get("status") or {}).get("phase") == "Training") >= len(names), "every run in Training")
    return found


def _wait(operator: Any, done: Callable[[], bool], what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        operator.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(2)


def _heartbeat(epoch: int, rank: int) -> dict:
    return {"phase": "training", "epoch": epoch, "step": epoch * 100, "time": time.time(), "rank": rank}


class Reporter:
    """Every `interval` s, each run reports its next epoch (each run at its own offset in the interval): by push
    from its pods, or by writing its progress.json to storage (pull)."""

    def __init__(self, bench: Any, cluster: Any, watch_: EpochWatch, pushers: list[Pusher], runs: list[str],
                 interval: float, url: Optional[str], ca: Optional[Path]):
        self.bench, self.cluster, self.watch, self.pushers, self.runs = bench, cluster, watch_, pushers, runs
        self.interval, self.url, self.ca = interval, url, ca
        self.codes: Counter = Counter()
        self.answered: list[float] = []  # each push's POST round trip, s
        self.epochs = {run: 1 for run in runs}

    def report_for(self, seconds: float) -> None:
        if self.url:
            asyncio.run(self._push_for(seconds))
        else:
            self._write_for(seconds)

    def warm_up(self, timeout: float = 900) -> dict[str, Any]:
        """Push mode: each pod pushes until accepted, taking the 429s' Retry-After as the trainer does, so that every
        token has been reviewed once (steady state: pods start at different times); how long that took. Each pod
        pushes from its own address, as pods do: new tokens are limited per address."""
        return asyncio.run(self._warm_up(timeout)) if self.url else {}

    async def _warm_up(self, timeout: float) -> dict[str, Any]:
        import aiohttp

        context = ssl.create_default_context(cafile=str(self.ca))
        started, codes, in_flight = time.monotonic(), Counter(), asyncio.Semaphore(64)

        async def accepted(pusher: Pusher) -> None:
            path = push_path(self.cluster.ns, pusher.run, HEARTBEAT)
            while time.monotonic() - started < timeout:
                try:
                    async with in_flight, aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                            ssl=context, force_close=True, local_addr=(pusher.source, 0))) as session:
                        async with session.post(self.url + path, json=_heartbeat(1, pusher.rank),
                                                headers={"Authorization": f"Bearer {pusher.token}"}) as response:
                            await response.read()
                            codes[response.status] += 1
                            if response.status == 202:
                                return
                            wait = float(response.headers.get("Retry-After") or 1)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    codes[type(exc).__name__] += 1
                    wait = 1.0
                await asyncio.sleep(wait * random.uniform(1, 2))

        await asyncio.gather(*(accepted(p) for p in self.pushers))
        return {"warm_up_s": time.monotonic() - started, "warm_up_codes": dict(codes)}

    def _rounds(self, seconds: float) -> list[tuple[float, str]]:
        offsets = {run: random.uniform(0, self.interval) for run in self.runs}
        return sorted((k * self.interval + offsets[run], run) for k in range(int(seconds // self.interval))
                      for run in self.runs)

    def _write_for(self, seconds: float) -> None:
        start = time.monotonic()
        runs = {name: self.cluster.run(name) for name in self.runs}

        def write(run: str) -> None:
            epoch = self.epochs[run] = self.epochs[run] + 1
            self.watch.reported(run, epoch, time.monotonic())
            self.bench.bucket.put_json(progress_uri(runs[run]), progress("running", epoch, maxEpochs=MAX_EPOCHS))
            self.codes["written"] += 1

        with ThreadPoolExecutor(POOL) as pool:
            for at, run in self._rounds(seconds):
                time.sleep(max(0.0, start + at - time.monotonic()))
                pool.submit(write, run)

    async def _push_for(self, seconds: float) -> None:
        import aiohttp

        by_run: dict[str, list[Pusher]] = {}
        for pusher in self.pushers:
            by_run.setdefault(pusher.run, []).append(pusher)
        context = ssl.create_default_context(cafile=str(self.ca))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=64)) as session:
            async def post(pusher: Pusher, what: str, document: dict) -> None:
                path, sent = push_path(self.cluster.ns, pusher.run, what), time.monotonic()
                try:
                    async with session.post(self.url + path, json=document,
                                            headers={"Authorization": f"Bearer {pusher.token}"}) as response:
                        await response.read()
                        self.codes[response.status] += 1
                        self.answered.append(time.monotonic() - sent)
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    self.codes[type(exc).__name__] += 1

            start, tasks = time.monotonic(), []
            for at, run in self._rounds(seconds):
                await asyncio.sleep(max(0.0, start + at - time.monotonic()))
                epoch = self.epochs[run] = self.epochs[run] + 1
                for pusher in by_run.get(run, []):
                    if pusher.rank == 0:
                        self.watch.reported(run, epoch, time.monotonic())
                        document = progress("running", epoch, maxEpochs=MAX_EPOCHS)
                        tasks.append(asyncio.ensure_future(post(pusher, PROGRESS, document)))
                    else:
                        tasks.append(asyncio.ensure_future(post(pusher, HEARTBEAT, _heartbeat(epoch, pusher.rank))))
            await asyncio.gather(*tasks)


# --- one mode ------------------------------------------------------------------------------------------------------


def status_env(folder: Path) -> tuple[dict[str, str], str, Path]:
    """The operator's settings for its status endpoint (as the chart sets them), its URL and the CA to trust."""
    tls = folder / "status-tls"
    write_serving_certificate(tls)
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    return ({"SCALINGRUN_STATUS_PORT_NUMBER": str(port), "SCALINGRUN_STATUS_TLS_DIR": str(tls),
             "SCALINGRUN_STATUS_URL": url}, url, tls / "ca.crt")


def operator_counts(port: int, metric: str) -> dict[str, float]:
    """A counter of the operator's by its one label: refusals by reason, accepted pushes by document."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {labels.split('"')[1]: value for labels, value in pod_scale.metric_lines(text, metric)}


def operator_accepted(port: int) -> float:
    return sum(operator_counts(port, "scalingrun_status_pushes_total").values())


def attackers_for(url: str, ca: Path, namespace: str, pushers: list[Pusher], own_run: str, victims: list[str],
                  rate: float, seconds: float) -> dict[str, push_attackers.Attacker]:
    """The two attackers, each from a source address no pushing pod has: the valid-token one with the token of its
    own run's pod, the garbage one spoiling a healthy pod's token; the victim is the first healthy run."""
    own = next(p for p in pushers if p.run == own_run)
    neighbour = next(p for p in pushers if p.run != own_run)
    kinds = push_attackers.plan(namespace, own_run, own.token, victims, victims[0], neighbour.token, rate)
    return {name: push_attackers.Attacker(url, str(ca), pod_address(len(pushers) + i), kinds[name], seconds,
                                          FORGED_EPOCH, MAX_EPOCHS)
            for i, name in enumerate((push_attackers.GARBAGE, push_attackers.VALID))}


class Window:
    """The operator's CPU, and API requests by it (the server's count minus the script's), over a stretch of time."""

    def __init__(self, bench: Any, operator: Any, counting: pod_scale.CountingApi):
        self.bench, self.operator, self.counting = bench, operator, counting
        self.cpu, self.wall = operator.cpu_seconds(), time.monotonic()
        text = pod_scale.server_metrics(bench.api)
        self.requests = pod_scale.requests_total(text) - counting.count
        self.by_resource = pod_scale.requests_by_resource(text)

    def close(self) -> dict[str, Any]:
        seconds = time.monotonic() - self.wall
        text = pod_scale.server_metrics(self.bench.api)
        requests = pod_scale.requests_total(text) - self.counting.count
        return {"seconds": seconds, "cpu_millicores": 1000 * (self.operator.cpu_seconds() - self.cpu) / seconds,
                "requests_per_min": (requests - self.requests) * 60 / seconds,
                # every client's, the script's too: what the operator's requests are
                "most_requested": pod_scale._most(pod_scale.requests_by_resource(text), self.by_resource, 6)}


def measure_mode(push: bool, args: Any, environment: Callable[..., Any], bench_type: Any, operator_type: Any,
                 create_all: Callable[..., None], storage_type: Any) -> dict[str, Any]:
    """One mode (push or pull) in a fresh API server, SeaweedFS and operator."""
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp, \
            environment(Path(tmp)) as (api, kubeconfig, s3, bucket):
        storage = storage_type(s3.endpoint)
        storage.server.handle_error = lambda *_: None
        bench = bench_type(api, s3, bucket, storage)
        counting = pod_scale.CountingApi(api)
        env, url, ca = status_env(Path(tmp)) if push else ({}, None, None)
        metrics_port = free_port()
        operator = operator_type(kubeconfig, Path(tmp) / "operator.log", env_extra=env, metrics_port=metrics_port)
        label = "push" if push else "pull"
        result: dict[str, Any] = {"mode": label}
        try:
            time.sleep(3)
            cluster = bench.namespace(f"bench-{label}")
            runs = {f"small-{i}": args.small_workers for i in range(args.small_runs)}
            if args.big_workers:
                runs["big-0"] = args.big_workers
            hostile_run = "hostile-0"
            started = time.monotonic()
            operator.reset_peak()
            pushers = prepare(bench, cluster, operator, {**runs, **({hostile_run: 1} if push else {})},
                              args.pushers, push, create_all)
            result["prepare_s"] = time.monotonic() - started
            print(f"  {label}: {len(runs)} runs in Training with {sum(runs.values())} workers, "
                  f"{len(pushers)} pushing pods, after {result['prepare_s']:.0f} s", flush=True)
            epochs = EpochWatch(bench.custom, cluster.ns)
            healthy = [p for p in pushers if p.run != hostile_run]
            reporter = Reporter(bench, cluster, epochs, healthy, list(runs), args.interval, url, ca)
            result.update(reporter.warm_up())
            result["peak_rss_prepared_mib"] = operator.peak_rss  # runs, pods and (push) every token reviewed once
            if push:
                print(f"  push: every pushing pod accepted once: {result}", flush=True)
            phases = [("reporting", False)] + ([("beside the attackers", True)] if push and args.hostile else [])
            for phase, attacked in phases:
                window = Window(bench, operator, counting)
                accepted_before = operator_accepted(metrics_port) if push else 0.0
                attackers = attackers_for(url, ca, cluster.ns, pushers, hostile_run, list(runs), args.hostile_rate,
                                          args.report_seconds) if attacked else {}
                reporter.report_for(args.report_seconds)
                lags, missed = epochs.take(args.interval * 3)
                answered, reporter.answered = reporter.answered, []
                figures = {**window.close(), "reports": len(lags) + missed, "missed": missed,
                           "peak_rss_mib": operator.peak_rss,  # the peak so far, this phase included
                           "lag_p50_s": pod_scale.percentile(lags, 0.5) if lags else None,
                           "lag_p95_s": pod_scale.percentile(lags, 0.95) if lags else None,
                           "lag_max_s": max(lags) if lags else None, "codes": dict(reporter.codes),
                           "post_p50_s": pod_scale.percentile(answered, 0.5) if answered else None,
                           "post_p95_s": pod_scale.percentile(answered, 0.95) if answered else None}
                reporter.codes.clear()
                if attackers:
                    figures["attackers"] = {name: a.counts() for name, a in attackers.items()}
                    figures["verdict"] = push_attackers.verdict(
                        figures["attackers"], figures["codes"].get(202, 0),
                        operator_accepted(metrics_port) - accepted_before, epochs.epoch(list(runs)[0]), FORGED_EPOCH)
                if push:
                    figures["refusals"] = operator_counts(metrics_port, "scalingrun_status_push_refusals_total")
                result[phase] = figures
                print(f"  {label}, {phase}: {figures}", flush=True)
                operator.check()
            # The last reconciles and Events; in pull mode a poll round (15 s, 5 reads a second) too.
            time.sleep(max(2 * args.interval, 30.0))
            window = Window(bench, operator, counting)
            time.sleep(args.rest_seconds)
            result["rest"] = window.close()
            result["runs"] = len(runs)
            result["peak_rss_mib"] = operator.peak_rss
            print(f"  {label}, at rest: {result['rest']}, peak RSS {operator.peak_rss:.0f} MiB", flush=True)
            epochs.stop()
        finally:
            operator.stop()
            storage.close()
            if os.environ.get("BENCH_OPERATOR_LOG"):
                import shutil
                shutil.copy(Path(tmp) / "operator.log", f"{os.environ['BENCH_OPERATOR_LOG']}.{label}")
    return result


def print_push(args: Any, modes: list[dict[str, Any]]) -> None:
    by = {m["mode"]: m for m in modes}
    push, pull = by.get("push"), by.get("pull")
    workers = f"{args.small_runs} runs x {args.small_workers} workers + 1 x {args.big_workers}"
    print(f"{workers}, a new epoch per run every {args.interval:.0f} s for {args.report_seconds:.0f} s "
          f"({args.pushers} pushing pods a run in push mode); at rest {args.rest_seconds:.0f} s")
    print()
    print("| measure | push | pull (baseline, same run) | push / pull |")
    print("|---|---|---|---|")

    def row(label: str, get: Callable[[dict], Optional[float]], unit: str = "", digits: int = 1) -> None:
        a = get(push) if push else None
        b = get(pull) if pull else None
        cell = lambda v: "-" if v is None else f"{v:.{digits}f}{unit}"  # noqa: E731
        ratio = f"{a / b:.2f}" if a is not None and b else "-"
        print(f"| {label} | {cell(a)} | {cell(b)} | {ratio} |")

    reporting = lambda key: (lambda m: m["reporting"][key])  # noqa: E731
    row("report -> status epoch, p50", reporting("lag_p50_s"), " s", 2)
    row("report -> status epoch, p95 (target < 2 s)", reporting("lag_p95_s"), " s", 2)
    row("report -> status epoch, max", reporting("lag_max_s"), " s", 2)
    row("reports not in status within 3 intervals", lambda m: m["reporting"]["missed"], "", 0)
    row("operator CPU while reporting", reporting("cpu_millicores"), " m")
    row("API requests/min by the operator while reporting", reporting("requests_per_min"))
    row("operator CPU at rest", lambda m: m["rest"]["cpu_millicores"], " m")
    row("API requests/min by the operator at rest", lambda m: m["rest"]["requests_per_min"])
    row("API requests/min per run at rest", lambda m: m["rest"]["requests_per_min"] / m["runs"], "", 3)
    row("peak RSS, runs prepared (push: every token reviewed once)", lambda m: m.get("peak_rss_prepared_mib"),
        " MiB", 0)
    row("peak RSS, after reporting", reporting("peak_rss_mib"), " MiB", 0)
    row("peak RSS, whole bench (push: the attackers' phase too)", lambda m: m["peak_rss_mib"], " MiB", 0)
    if push and "warm_up_s" in push:
        print()
        print(f"Push, before the figures: every pushing pod's first push accepted after {push['warm_up_s']:.0f} s "
              f"(new tokens reviewed; answers {push['warm_up_codes']})")
    if push and "beside the attackers" in push:
        import yaml

        beside = push["beside the attackers"]
        from tests.support.env import ROOT

        limit = push_attackers.limit_mib(yaml.safe_load((ROOT / "charts/scalingrun/values.yaml").read_text()))
        print()
        print("\n".join(push_attackers.table(push["reporting"], beside, beside["attackers"], args.report_seconds,
                                             beside["verdict"], push["peak_rss_mib"], limit)))
        print(f"Healthy pushes' answers: without {push['reporting']['codes']}, beside {beside['codes']}")
        print(f"Refusals counted by the operator (whole run): {beside.get('refusals')}")
