"""Preprocessing at scale (`bench/preprocess.py --scale`): a synthetic tree of small JPEGs in a local SeaweedFS,
planned once and preprocessed with 1 and with 2 shard processes.

The tree: IMAGES files in 100 class folders, each a 64 x 64 JPEG (about 2 KB) drawn from 256 distinct seeded
noise-and-gradient images (the keys differ, the bytes repeat: decoding cost is real, generation is quick), loaded by
`weed filer.copy` from local hard links into the bucket's filer folder (make_tree). Measured per row:
  plan       the planner alone (the listing and the plan, as shard 0 makes it), in its own process, through a
             counting proxy: its LIST requests (ListObjectsV2 under the source), seconds and peak RSS; beside it
             the LIST requests of one recursive listing of the source, what every shard made before the plan;
  1 process  `scalingrun-trainer preprocess --shard-count 1 --workers 1`: seconds, images/s, peak RSS;
  2 processes  two shard processes with one plan id (shard 0 plans, shard 1 waits): wall seconds, images/s,
             peak RSS of each;
  output     the dataset's Parquet bytes;
  first batch  the trainer's readers over the 2-process result in a fresh process (FIRST_BATCH);
  fetch ahead  one process over a sample of --latency-images files, through a proxy that delays every request by
             --latency-ms (a store farther away than this local one): --fetch-ahead 1 (one GET at a time, as
             before) against the default, in the same run.
Peak RSS is the process's own VmHWM, read by itself as it ends (--workers 1 decodes in the shard process itself).
Run: PYTHONPATH=operator:trainer:. .venv/bin/python bench/preprocess.py --scale --images 20000 [--images 200000]
`--shard-images 20000`: instead, shard 0 alone of a Job with images / 20000 shards (its peak RSS and seconds).
"""

from __future__ import annotations

import io
import shutil
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import unquote

import numpy as np
from PIL import Image
from pyarrow import fs as pafs

from scalingrun_operator.local.s3server import S3Server, weed_binary
from tests.support.flaky_s3 import FlakyS3

CLASSES = 100
DISTINCT = 256
SIDE = 32
BUCKET = "scale"

PLAN_ONLY = """
import json, resource, sys, time
from scalingrun_trainer.preprocess.plan import write_plan
from scalingrun_trainer.preprocess.source import Params
from scalingrun_trainer.storage import open_location
source, output = sys.argv[1], sys.argv[2]
params = Params(source, output, image_size=int(sys.argv[3]))
started = time.monotonic()
plan = write_plan(params, open_location(source), open_location(output), int(sys.argv[4]), "bench")
print(json.dumps({"seconds": time.monotonic() - started, "files": plan.source_files}))
"""


def jpegs() -> list[bytes]:
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 64)[None, :, None]
    out = []
    for _ in range(DISTINCT):
        pixels = np.clip(ramp * rng.uniform(0.2, 1, 3) + rng.normal(0, 40, (64, 64, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=85)
        out.append(buffer.getvalue())
    return out


def make_tree(server: S3Server, prefix: str, images: int) -> float:
    """The tree, written the fast way: DISTINCT JPEGs encoded once, hard-linked locally under every key (no bytes
    copied), then `weed filer.copy` (SeaweedFS's own bulk loader, 16 files at once over gRPC) into the bucket's
    folder on the filer, which is what the S3 gateway serves: the same objects as PUTs would make, about 8x faster
    than 16 threads of S3 PUTs here (3,000 files: 1.8 s against 14 s)."""
    started = time.monotonic()
    local = Path(tempfile.mkdtemp(prefix="scale-tree-"))
    try:
        originals = local / "originals"
        originals.mkdir()
        for index, data in enumerate(jpegs()):
            (originals / f"{index}.jpg").write_bytes(data)
        tree = local / prefix
        for index in range(CLASSES):
            (tree / f"class-{index:03d}").mkdir(parents=True)
        for index in range(images):
            os.link(originals / f"{index % DISTINCT}.jpg", tree / f"class-{index % CLASSES:03d}/img-{index:07d}.jpg")
        filer = f"http://127.0.0.1:{server.s3_port - 1}/buckets/{BUCKET}/"  # S3Server: filer port = S3 port - 1
        subprocess.run([weed_binary(), "filer.copy", "-c", "16", str(tree), filer], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        shutil.rmtree(local)
    return time.monotonic() - started


# Runs a command line's module under `python -c` and writes its own peak RSS (VmHWM, which exec resets: a child's
# ru_maxrss would include the forked copy of this bench) and its CPU seconds (user + system, its threads and any
# children it waited for) to the file named first.
PEAK_RSS = """
import resource, runpy, sys
out, sys.argv = sys.argv[1], sys.argv[2:]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
finally:
    peak = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    open(out, "w").write(f"{peak} {cpu}")
"""

# The trainer's two readers over the result, rank 0 of 1, in a fresh process: seconds from opening the dataset (its
# manifest and every file's footer) to the first training batch of the Parquet/Petastorm reader as the Keras and
# Lightning trainers use it (4 reader threads, 50 row groups queued, a 256-row shuffle buffer, batches of 32), and
# to the first batch of the feature cache's pass (shard_pixels: the shard once, in order, 2 reader threads).
FIRST_BATCH = """
import json, sys, time
from scalingrun_trainer.core.dataset import batches, open_dataset, open_reader, pixel_groups
from scalingrun_trainer.core.feature_cache import shard_pixels
uri = sys.argv[1]
started = time.monotonic()
dataset = open_dataset(uri)
opened = time.monotonic()
reader = open_reader(dataset, "train", shard=0, shards=1, seed=0, reader_threads=4, results_queue_size=50)
try:
    next(batches(pixel_groups(reader, dataset), 32, shuffle_rows=256, seed=0, drop_remainder=True))
    training = time.monotonic()
finally:
    reader.stop()
    reader.join()
started_cache = time.monotonic()
cache_dataset = open_dataset(uri)
pass_ = shard_pixels(cache_dataset, "train", rank=0, size=1, seed=0, batch_size=32)
next(pass_)
cache = time.monotonic()
pass_.close()
print(json.dumps({"open": opened - started, "training": training - started, "featureCache": cache - started_cache,
                  "rowGroups": dataset.row_groups["train"], "files": len(dataset.files["train"])}))
"""


def timed(commands: list[list[str]], env: dict) -> tuple[float, list[int], list[str], list[float]]:
    """Wall seconds, each process's peak RSS (bytes), stdout and CPU seconds. Commands are [python, -m, module, ...] or
    [python, -c, code, ...]."""
    folder = Path(tempfile.mkdtemp(prefix="peaks-"))
    wrapped = []
    for index, c in enumerate(commands):
        if c[1] == "-m":
            wrapped.append([c[0], "-c", PEAK_RSS, str(folder / str(index)), c[2], *c[3:]])
        else:
            code = PEAK_RSS.replace("runpy.run_module(sys.argv[0], run_name=\"__main__\", alter_sys=True)",
                                    "exec(compile(sys.argv[0], '<plan>', 'exec'), {'__name__': '__main__'})")
            wrapped.append([c[0], "-c", code, str(folder / str(index)), c[2], *c[3:]])
    started = time.monotonic()
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=open(folder / f"{i}.err", "wb"), env=env)
                 for i, c in enumerate(wrapped)]
    outputs = [p.communicate()[0].decode() for p in processes]
    seconds = time.monotonic() - started
    for index, (command, process) in enumerate(zip(commands, processes)):
        if process.returncode:
            said = (folder / f"{index}.err").read_text(errors="replace")[-2000:]
            raise SystemExit(f"{command[:6]} failed ({process.returncode}):\n{said}")
    measured = [(folder / str(i)).read_text().split() for i in range(len(commands))]
    return seconds, [int(peak) * 1024 for peak, _ in measured], outputs, [float(cpu) for _, cpu in measured]


def preprocess(source: str, output: str, shards: int, index: int, plan_id: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", source, "--output", output,
            "--image-size", str(SIDE), "--workers", "1", "--shard-count", str(shards), "--shard-index", str(index),
            "--plan-id", plan_id, *options]


def fetch_ahead_ratio(server: S3Server, source: str, env: dict, images: int, sample: int,
                      latency_ms: float) -> dict:
    """One process over `sample` of the files, every request delayed by `latency_ms`: one GET at a time against
    the default fetch-ahead."""
    proxy = FlakyS3(server.endpoint, hang=10**9, hang_seconds=latency_ms / 1000)
    try:
        slow = {**env, "AWS_ENDPOINT_URL": proxy.endpoint}
        fraction = str(min(1.0, sample / images))
        seconds = {}
        for name, ahead in (("oneByOne", "1"), ("ahead", None)):
            command = preprocess(source, f"s3://{BUCKET}/latency-{name}", 1, 0, f"latency-{name}",
                                 "--sample-fraction", fraction, *(["--fetch-ahead", ahead] if ahead else []))
            seconds[name], _, _, _ = timed([command], slow)
    finally:
        proxy.close()
    return {"latencyMs": latency_ms, "files": sample, "oneByOneSeconds": round(seconds["oneByOne"], 1),
            "aheadSeconds": round(seconds["ahead"], 1), "ratio": round(seconds["oneByOne"] / seconds["ahead"], 2)}


def source_lists(proxy: FlakyS3, since: int = 0) -> int:
    """ListObjectsV2 requests under the source's prefix."""
    return sum(1 for method, path, _ in proxy.requests[since:]
               if method == "GET" and "list-type=2" in path and "prefix=tree/" in unquote(path))


def size_of(server: S3Server, prefix: str) -> int:
    fs = server.filesystem()
    return sum(i.size for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True))
               if i.path.endswith(".parquet"))


def run_one_shard(images: int, per_shard: int) -> dict:
    """Shard 0 alone of a Job with a fixed number of files per shard (images / per_shard shards): it plans the
    whole tree, then processes its share, as shard 0's pod does. Its peak RSS is what a pod needs when
    `parallelism` grows with the tree."""
    folder = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    server = S3Server(folder / "seaweedfs", "bench-" + uuid.uuid4().hex[:6], uuid.uuid4().hex).start()
    try:
        server.create_bucket(BUCKET)
        make_tree(server, "tree", images)
        shards = max(1, images // per_shard)
        shard0 = preprocess(f"s3://{BUCKET}/tree", f"s3://{BUCKET}/fixed", shards, 0, "fixed")
        seconds, [rss], _, [cpu] = timed([shard0], {**os.environ, **server.env()})
        return {"images": images, "shards": shards, "shard0Seconds": round(seconds, 1),
                "shard0PeakRssMiB": round(rss / 2**20), "shard0CpuSeconds": round(cpu, 1)}
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def run(images: int, latency_images: int, latency_ms: float) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    server = S3Server(folder / "seaweedfs", "bench-" + uuid.uuid4().hex[:6], uuid.uuid4().hex).start()
    try:
        server.create_bucket(BUCKET)
        generated = make_tree(server, "tree", images)
        source = f"s3://{BUCKET}/tree"
        env = {**os.environ, **server.env()}
        proxy = FlakyS3(server.endpoint)
        try:
            plan_env = {**env, "AWS_ENDPOINT_URL": proxy.endpoint}
            plan_seconds, [plan_rss], [plan_out], _ = timed(
                [[sys.executable, "-c", PLAN_ONLY, source, f"s3://{BUCKET}/planned", str(SIDE), "2"]], plan_env)
            lists = source_lists(proxy)
            # Before the plan, every shard made one recursive listing of the whole source: this many requests each.
            before = len(proxy.requests)
            proxied = pafs.S3FileSystem(access_key=server.access_key, secret_key=server.secret_key,
                                        endpoint_override=proxy.endpoint[len("http://"):], scheme="http",
                                        region="us-east-1")
            proxied.get_file_info(pafs.FileSelector(f"{BUCKET}/tree", recursive=True))
            lists_per_shard_before = source_lists(proxy, since=before)
        finally:
            proxy.close()
        one_seconds, [one_rss], _, [one_cpu] = timed([preprocess(source, f"s3://{BUCKET}/one", 1, 0, "one")], env)
        two_seconds, two_rss, _, two_cpu = timed(
            [preprocess(source, f"s3://{BUCKET}/two", 2, i, "two") for i in (0, 1)], env)
        fetch_ahead = fetch_ahead_ratio(server, source, env, images, latency_images, latency_ms)
        first_batch = json.loads(subprocess.run([sys.executable, "-c", FIRST_BATCH, f"s3://{BUCKET}/two"], env=env,
                                                check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout)
        return {"images": images, "generateSeconds": round(generated, 1), "listRequests": lists,
                "listRequestsPerShardBefore": lists_per_shard_before,
                "planSeconds": round(json.loads(plan_out)["seconds"], 2), "planPeakRssMiB": round(plan_rss / 2**20),
                "oneProcessSeconds": round(one_seconds, 1), "oneProcessImagesPerSecond": round(images / one_seconds),
                "oneProcessPeakRssMiB": round(one_rss / 2**20),
                "oneProcessCpuMsPerImage": round(1000 * one_cpu / images, 2),
                "twoProcessesSeconds": round(two_seconds, 1),
                "twoProcessesImagesPerSecond": round(images / two_seconds),
                "twoProcessesPeakRssMiB": [round(r / 2**20) for r in two_rss],
                "twoProcessesCpuMsPerImage": round(1000 * sum(two_cpu) / images, 2),
                "firstBatchSeconds": {k: round(v, 2) if isinstance(v, float) else v for k, v in first_batch.items()},
                "outputMiB": round(size_of(server, "one") / 2**20, 1), "fetchAhead": fetch_ahead}
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, action="append", help="tree sizes (default: 20000)")
    parser.add_argument("--shard-images", type=int, help="instead: shard 0 alone, of images / this many shards")
    parser.add_argument("--latency-images", type=int, default=2000, help="the fetch-ahead sample (default 2000)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the delay a request (default 20 ms)")
    args = parser.parse_args(argv)
    for images in args.images or [20000]:
        print(json.dumps(run_one_shard(images, args.shard_images) if args.shard_images
                         else run(images, args.latency_images, args.latency_ms)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
