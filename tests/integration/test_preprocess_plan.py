"""Preprocessing at scale, against a real S3 server (SeaweedFS): the source listed once by a planner, a shard
killed mid-way resumed from its committed parts, and a grown tree rebuilding only the shards whose files changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from scalingrun_operator.local.sample_data import fashion_mnist_jpegs
from tests.support.flaky_s3 import FlakyS3

pytestmark = pytest.mark.s3

BUCKET = "plans"


def upload(server, prefix: str, files: dict[str, bytes]) -> None:
    fs = server.filesystem()
    for relative, data in files.items():
        with fs.open_output_stream(f"{BUCKET}/{prefix}/{relative}") as stream:
            stream.write(data)


@pytest.fixture(scope="module")
def bucket(s3_server) -> str:
    s3_server.create_bucket(BUCKET)
    return BUCKET


def command(source: str, output: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", source, "--output", output,
            *extra]


def run(server, source: str, output: str, *extra: str, endpoint: str = "") -> list[dict]:
    """The JSON summaries (one per shard run) of a finished preprocess call."""
    env = {**os.environ, **server.env(), **({"AWS_ENDPOINT_URL": endpoint} if endpoint else {})}
    result = subprocess.run(command(source, output, *extra), capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def dataset_rows(server, output: str) -> dict[str, list]:
    """Each split's rows (path, label, image) in the manifest's file order, row group by row group."""
    fs = server.filesystem()
    root = output[len("s3://"):]
    manifest = json.loads(fs.open_input_stream(f"{root}/_manifest.json").read())
    rows = {}
    for split, names in manifest["files"].items():
        groups = []
        for name in names:
            parquet = pq.ParquetFile(fs.open_input_file(f"{root}/{name}"))
            for index in range(parquet.num_row_groups):
                group = parquet.read_row_group(index)
                groups.append(list(zip(*(group.column(c).to_pylist() for c in ("path", "label", "image")))))
        rows[split] = groups
    return rows


def mtimes(server, folder: str) -> dict[str, object]:
    fs = server.filesystem()
    return {i.path: i.mtime for i in fs.get_file_info(pafs.FileSelector(folder, recursive=True))
            if i.type == pafs.FileType.File}


def source_lists(proxy: FlakyS3, prefix: str) -> int:
    """LIST requests (ListObjectsV2) the proxy forwarded for keys under the source prefix."""
    return sum(1 for method, path, _ in proxy.requests
               if method == "GET" and "list-type=2" in path and f"prefix={prefix}" in unquote(path))


def test_only_the_planner_lists_the_source(s3_server, bucket):
    upload(s3_server, "listed", dict(fashion_mnist_jpegs(6)))
    source, output = f"s3://{BUCKET}/listed", f"s3://{BUCKET}/listed-out"
    planner, others = FlakyS3(s3_server.endpoint), FlakyS3(s3_server.endpoint)
    try:
        # The other shards start first: they wait for shard 0's plan of this id, then read only their part.
        env = {**os.environ, **s3_server.env(), "AWS_ENDPOINT_URL": others.endpoint}
        waiting = [subprocess.Popen(command(source, output, "--shard-count", "3", "--shard-index", str(index),
                                            "--plan-id", "job-1", "--workers", "1"),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                   for index in (1, 2)]
        for process in waiting:  # each says it waits before shard 0 exists
            assert any("waiting for shard 0's plan (job-1)" in line for line in process.stderr), process.args
        summaries = run(s3_server, source, output, "--shard-count", "3", "--shard-index", "0", "--plan-id", "job-1",
                        "--workers", "1", endpoint=planner.endpoint)
        for process in waiting:
            out, err = process.communicate(timeout=300)
            assert process.returncode == 0, err
            summaries.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        planner.close()
        others.close()
    assert source_lists(planner, "listed/") >= 1
    assert source_lists(others, "listed/") == 0  # the waiting shards never listed the source
    # Whichever shard finished last published the dataset (two finishing together may both write the same one).
    assert [s["shard"] for s in summaries] == [0, 1, 2] and any(s["complete"] for s in summaries)
    one = f"s3://{BUCKET}/listed-one"
    run(s3_server, source, one, "--shard-count", "1", "--workers", "1")
    assert {split: sorted(r for g in groups for r in g) for split, groups in dataset_rows(s3_server, output).items()} \
        == {split: sorted(r for g in groups for r in g) for split, groups in dataset_rows(s3_server, one).items()}


def test_a_killed_shard_redoes_only_the_parts_it_had_not_committed(s3_server, bucket):
    # Large JPEGs decoded by one process, in many small parts: the shard is still busy when its first part lands.
    upload(s3_server, "big", dict(fashion_mnist_jpegs(30, size=1024)))
    source = f"s3://{BUCKET}/big"
    args = ("--shard-count", "1", "--image-size", "224", "--max-readers", "16", "--workers", "1")
    killed = f"s3://{BUCKET}/big-killed"
    env = {**os.environ, **s3_server.env()}
    process = subprocess.Popen(command(source, killed, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    for line in process.stderr:  # the cause: a part committed (it is in place and recorded)
        if "committed train part 0" in line:
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the shard finished before it could be killed"
    records = [p for p in mtimes(s3_server, f"{BUCKET}/big-killed/_parts")]
    committed = {p: m for p, m in mtimes(s3_server, f"{BUCKET}/big-killed/train").items() if "_tmp-" not in p}
    assert records and len(committed) == len(records)  # train parts only: validation comes after them

    [summary] = run(s3_server, source, killed, *args)
    assert summary["complete"] and summary["partsResumed"] == len(records)
    after = mtimes(s3_server, f"{BUCKET}/big-killed/train")
    assert all(after[p] == m for p, m in committed.items())  # the committed parts were not written again
    assert len(after) > len(committed)
    assert not mtimes(s3_server, f"{BUCKET}/big-killed/_parts")  # records go once the shard is done
    assert not [p for p in mtimes(s3_server, f"{BUCKET}/big-killed") if "_tmp-" in p]

    whole = f"s3://{BUCKET}/big-whole"
    run(s3_server, source, whole, *args)
    assert dataset_rows(s3_server, killed) == dataset_rows(s3_server, whole)  # row for row, group for group


def test_a_grown_tree_rebuilds_only_the_shards_whose_files_changed(s3_server, bucket):
    files = dict(fashion_mnist_jpegs(8))
    upload(s3_server, "grow", files)
    source, output = f"s3://{BUCKET}/grow", f"s3://{BUCKET}/grow-out"
    args = ("--shard-count", "4", "--all-shards", "--workers", "1", "--validation-fraction", "0.3")
    first = run(s3_server, source, output, *args)
    assert [s["shardReused"] for s in first] == [False] * 4
    before = dataset_rows(s3_server, output)
    parts_before = mtimes(s3_server, f"{BUCKET}/grow-out/train")

    path, data = next((p, d) for p, d in fashion_mnist_jpegs(9) if p not in files)
    new = {path: data}
    upload(s3_server, "grow", new)
    second = run(s3_server, source, output, *args)
    # Shards after the one that completed the dataset find it complete ("reused": the dataset, not the shard).
    rebuilt = [s["shard"] for s in second if s.get("shardReused") is False]
    assert len(rebuilt) == 1  # one new file: one shard made anew, three kept
    manifest = json.loads(s3_server.filesystem().open_input_stream(f"{BUCKET}/grow-out/_manifest.json").read())
    assert manifest["shardsReused"] == 3 and manifest["sourceFiles"] == len(files) + 1
    parts_after = mtimes(s3_server, f"{BUCKET}/grow-out/train")
    kept = {p: m for p, m in parts_before.items() if f"part-{rebuilt[0]:05d}-" not in p}
    assert all(parts_after.get(p) == m for p, m in kept.items())  # the kept shards' files were not rewritten

    after = dataset_rows(s3_server, output)
    split_of = lambda rows: {r[0]: split for split, groups in rows.items() for g in groups for r in g}  # noqa: E731
    old, grown = split_of(before), split_of(after)
    assert {path: grown[path] for path in old} == old  # no old file changed its split
    assert set(grown) - set(old) == set(new)
    # The same dataset as preprocessing the grown tree from scratch.
    fresh = f"s3://{BUCKET}/grow-fresh"
    run(s3_server, source, fresh, *args)
    assert dataset_rows(s3_server, fresh) == after
