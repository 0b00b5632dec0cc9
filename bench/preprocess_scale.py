"""Preprocessing at scale (`bench/preprocess.py --scale`): a synthetic tree of small JPEGs in a local SeaweedFS,
planned once and preprocessed with 1 and with 2 shard processes.

The tree: IMAGES files in 100 class folders, each a 64 x 64 JPEG (about 2 KB) drawn from 256 distinct seeded
noise-and-gradient images, uploaded by 16 threads (the keys differ, the bytes repeat: decoding cost is real,
generation is quick). Measured per row:
  plan       the planner alone (the listing and the plan, as shard 0 makes it), in its own process, through a
             counting proxy: its LIST requests (ListObjectsV2 under the source), seconds and peak RSS; beside it
             the LIST requests of one recursive listing of the source, what every shard made before the plan;
  1 process  `scalingrun-trainer preprocess --shard-count 1 --workers 1`: seconds, images/s, peak RSS;
  2 processes  two shard processes with one plan id (shard 0 plans, shard 1 waits): wall seconds, images/s,
             peak RSS of each;
  output     the dataset's Parquet bytes.
Peak RSS is the process's own VmHWM, read by itself as it ends (--workers 1 decodes in the shard process itself).
Run: PYTHONPATH=operator:trainer:. .venv/bin/python bench/preprocess.py --scale --images 20000 [--images 200000]
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote

import numpy as np
from PIL import Image
from pyarrow import fs as pafs

from scalingrun_operator.local.s3server import S3Server
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
    started = time.monotonic()
    data = jpegs()
    fs = server.filesystem()

    def put(index: int) -> None:
        with fs.open_output_stream(f"{BUCKET}/{prefix}/class-{index % CLASSES:03d}/img-{index:07d}.jpg") as stream:
            stream.write(data[index % DISTINCT])

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(images), chunksize=256))
    return time.monotonic() - started


# Runs a command line's module under `python -c` and writes its own peak RSS (VmHWM, which exec resets: a child's
# ru_maxrss would include the forked copy of this bench) to the file named first.
PEAK_RSS = """
import runpy, sys
out, sys.argv = sys.argv[1], sys.argv[2:]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
finally:
    peak = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    open(out, "w").write(peak)
"""


def timed(commands: list[list[str]], env: dict) -> tuple[float, list[int], list[str]]:
    """Wall seconds, each process's peak RSS (bytes) and stdout. Commands are [python, -m, module, ...] or
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
    processes = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env) for c in wrapped]
    outputs = [p.communicate()[0].decode() for p in processes]
    seconds = time.monotonic() - started
    for command, process in zip(commands, processes):
        if process.returncode:
            raise SystemExit(f"{command[:6]} failed ({process.returncode})")
    return seconds, [int((folder / str(i)).read_text()) * 1024 for i in range(len(commands))], outputs


def preprocess(source: str, output: str, shards: int, index: int, plan_id: str) -> list[str]:
    return [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", source, "--output", output,
            "--image-size", str(SIDE), "--workers", "1", "--shard-count", str(shards), "--shard-index", str(index),
            "--plan-id", plan_id]


def source_lists(proxy: FlakyS3, since: int = 0) -> int:
    """ListObjectsV2 requests under the source's prefix."""
    return sum(1 for method, path, _ in proxy.requests[since:]
               if method == "GET" and "list-type=2" in path and "prefix=tree/" in unquote(path))


def size_of(server: S3Server, prefix: str) -> int:
    fs = server.filesystem()
    return sum(i.size for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True))
               if i.path.endswith(".parquet"))


def run(images: int) -> dict:
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
            plan_seconds, [plan_rss], [plan_out] = timed(
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
        one_seconds, [one_rss], _ = timed([preprocess(source, f"s3://{BUCKET}/one", 1, 0, "one")], env)
        two_seconds, two_rss, _ = timed([preprocess(source, f"s3://{BUCKET}/two", 2, i, "two") for i in (0, 1)], env)
        return {"images": images, "generateSeconds": round(generated, 1), "listRequests": lists,
                "listRequestsPerShardBefore": lists_per_shard_before,
                "planSeconds": round(json.loads(plan_out)["seconds"], 2), "planPeakRssMiB": round(plan_rss / 2**20),
                "oneProcessSeconds": round(one_seconds, 1), "oneProcessImagesPerSecond": round(images / one_seconds),
                "oneProcessPeakRssMiB": round(one_rss / 2**20),
                "twoProcessesSeconds": round(two_seconds, 1),
                "twoProcessesImagesPerSecond": round(images / two_seconds),
                "twoProcessesPeakRssMiB": [round(r / 2**20) for r in two_rss],
                "outputMiB": round(size_of(server, "one") / 2**20, 1)}
    finally:
        server.stop()


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, action="append", help="tree sizes (default: 20000)")
    args = parser.parse_args(argv)
    for images in args.images or [20000]:
        print(json.dumps(run(images)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
