"""Preprocessing against a real S3 server (SeaweedFS) with real images, odd files included."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from pyarrow import fs as pafs

from scalingrun_operator.local.sample_data import fashion_mnist_jpegs, photos

pytestmark = pytest.mark.s3

BUCKET = "raw"
SOURCE = f"s3://{BUCKET}/fashion"
SIZE = 48
BAD_FILES = {"bag/truncated.jpg", "bag/notes.txt", "coat/empty.jpg"}
ODD_BUT_GOOD = {"dress/cmyk.jpg", "dress/grey.jpg", "shirt/alpha.png", "sandal/astronaut.jpg"}


def s3fs(server) -> pafs.S3FileSystem:
    return server.filesystem()


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def source_tree(s3_server) -> dict[str, bytes]:
    """Fashion-MNIST JPEGs (12 per class), real photos, and files that are odd or broken."""
    files = dict(fashion_mnist_jpegs(12))
    photo = dict(photos())["astronaut"].resize((600, 600))
    good_jpeg = encode(photo, "JPEG")
    files.update({
        "dress/cmyk.jpg": encode(photo.convert("CMYK"), "JPEG"),
        "dress/grey.jpg": encode(photo.convert("L"), "JPEG"),
        "shirt/alpha.png": encode(photo.convert("RGBA"), "PNG"),
        "sandal/astronaut.jpg": good_jpeg,
        "bag/truncated.jpg": good_jpeg[: len(good_jpeg) // 3],
        "bag/notes.txt": b"these are not pixels",
        "coat/empty.jpg": b"",
    })
    s3_server.create_bucket(BUCKET)
    fs = s3fs(s3_server)
    for relative, data in files.items():
        with fs.open_output_stream(f"{BUCKET}/fashion/{relative}") as stream:
            stream.write(data)
    return files


def preprocess(server, output: str, *extra: str, check: bool = True) -> tuple[dict, subprocess.CompletedProcess]:
    env = {**os.environ, **server.env()}
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", SOURCE, "--output", output,
         "--image-size", str(SIZE), "--workers", "2", *extra],
        capture_output=True, text=True, env=env, timeout=300,
    )
    if check:
        assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    return summary, result


def read_split(server, output: str, split: str) -> dict[str, tuple[int, bytes]]:
    fs = s3fs(server)
    manifest = json.loads(fs.open_input_stream(f"{output[5:]}/_manifest.json").read())
    rows = {}
    for name in manifest["files"][split]:
        table = pq.read_table(f"{output[5:]}/{name}", filesystem=fs)
        for image, label, path in zip(*(table.column(c).to_pylist() for c in ("image", "label", "path"))):
            rows[path] = (label, image)
    return rows


def test_counts_labels_shapes_and_skipped_files(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-basic"
    summary, result = preprocess(s3_server, output)
    assert summary["complete"] and not summary["reused"]
    assert summary["skipped"] == len(BAD_FILES)
    assert {f["path"] for f in summary["skippedFiles"]} == BAD_FILES
    train, validation = read_split(s3_server, output, "train"), read_split(s3_server, output, "validation")
    assert summary["written"] == {"train": len(train), "validation": len(validation)}
    assert set(train) | set(validation) == set(source_tree) - BAD_FILES
    assert not set(train) & set(validation)
    classes = json.loads(s3fs(s3_server).open_input_stream(f"{BUCKET}/out-basic/_classes.json").read())
    assert classes == sorted({p.split("/")[0] for p in source_tree})
    for path, (label, image) in {**train, **validation}.items():
        assert classes[label] == path.split("/")[0]
        assert len(image) == SIZE * SIZE * 3
    pixels = np.frombuffer(train.get("dress/cmyk.jpg", validation.get("dress/cmyk.jpg"))[1], np.uint8)
    assert pixels.reshape(SIZE, SIZE, 3).std() > 10  # a real picture, not a blank canvas
    assert "img/s" in result.stderr  # progress for humans on stderr


def test_split_is_the_same_for_any_shard_count(s3_server, source_tree):
    one, _ = preprocess(s3_server, f"s3://{BUCKET}/out-one", "--shard-count", "1")
    summaries = [preprocess(s3_server, f"s3://{BUCKET}/out-three", "--shard-count", "3", "--shard-index", str(i))[0]
                 for i in range(3)]
    assert [s["complete"] for s in summaries] == [False, False, True]
    assert summaries[-1]["dataset"]["written"] == one["written"]
    for split in ("train", "validation"):
        assert read_split(s3_server, f"s3://{BUCKET}/out-one", split) == read_split(
            s3_server, f"s3://{BUCKET}/out-three", split)


def test_rerun_with_same_fingerprint_does_nothing(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-rerun"
    first, _ = preprocess(s3_server, output)
    fs = s3fs(s3_server)
    # The plan is made again (listing the source is how a rerun learns that nothing changed); nothing else moves.
    dataset = lambda: {i.path: i.mtime for i in fs.get_file_info(  # noqa: E731
        pafs.FileSelector(f"{BUCKET}/out-rerun", recursive=True)) if "/_plan" not in i.path}
    before = dataset()
    again, _ = preprocess(s3_server, output)
    after = dataset()
    assert again["reused"] and again["fingerprint"] == first["fingerprint"]
    assert after == before


def test_crashed_shard_is_rerun_alone(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-crash"
    for index in (0, 1):
        preprocess(s3_server, output, "--shard-count", "2", "--shard-index", str(index))
    fs = s3fs(s3_server)
    shard0 = {i.path: i.mtime for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/out-crash", recursive=True))
              if "part-00000" in i.path}
    # Shard 1 "crashed": its manifest never landed and the dataset manifest is gone.
    fs.delete_file(f"{BUCKET}/out-crash/_shards/shard-00001-of-00002.json")
    fs.delete_file(f"{BUCKET}/out-crash/_manifest.json")
    summary, result = preprocess(s3_server, output, "--shard-count", "2", "--shard-index", "1")
    assert summary["complete"] and summary["dataset"]["skipped"] == len(BAD_FILES)
    after = {i.path: i.mtime for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/out-crash", recursive=True))
             if "part-00000" in i.path}
    assert after == shard0  # shard 0 was not redone
    assert not [i for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/out-crash", recursive=True))
                if "_tmp-" in i.path]


def test_new_parameters_replace_the_old_dataset(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-params"
    first, _ = preprocess(s3_server, output, "--seed", "1")
    second, _ = preprocess(s3_server, output, "--seed", "2")
    assert second["fingerprint"] != first["fingerprint"] and not second["reused"]
    names = {f"train/{i.base_name}" for i in s3fs(s3_server).get_file_info(
        pafs.FileSelector(f"{BUCKET}/out-params/train"))}
    manifest = json.loads(s3fs(s3_server).open_input_stream(f"{BUCKET}/out-params/_manifest.json").read())
    assert names and names == set(manifest["files"]["train"])  # the first dataset's files are gone


def test_row_groups_allow_two_per_reader(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-groups"
    preprocess(s3_server, output, "--max-readers", "4", "--validation-fraction", "0.3")
    fs = s3fs(s3_server)
    manifest = json.loads(fs.open_input_stream(f"{BUCKET}/out-groups/_manifest.json").read())
    for split in ("train", "validation"):
        groups = sum(pq.ParquetFile(fs.open_input_file(f"{BUCKET}/out-groups/{f}")).num_row_groups
                     for f in manifest["files"][split])
        assert groups >= 8, split


def row_groups(server, output: str, split: str) -> list[list[tuple[str, int]]]:
    """Each row group's (path, label) rows, in the order they were written."""
    fs = s3fs(server)
    manifest = json.loads(fs.open_input_stream(f"{output[5:]}/_manifest.json").read())
    groups = []
    for name in manifest["files"][split]:
        parquet = pq.ParquetFile(fs.open_input_file(f"{output[5:]}/{name}"))
        for i in range(parquet.num_row_groups):
            group = parquet.read_row_group(i, columns=["path", "label"])
            groups.append(list(zip(group.column("path").to_pylist(), group.column("label").to_pylist())))
    return groups


def test_rows_are_written_in_a_seeded_order_that_mixes_the_classes(s3_server, source_tree):
    """In the tree's (path) order a row group held a few classes and the readers' batches one or two."""
    preprocess(s3_server, f"s3://{BUCKET}/out-order-a", "--seed", "5")
    preprocess(s3_server, f"s3://{BUCKET}/out-order-b", "--seed", "5", "--max-bad-fraction", "0.5")
    preprocess(s3_server, f"s3://{BUCKET}/out-order-c", "--seed", "6")
    groups = row_groups(s3_server, f"s3://{BUCKET}/out-order-a", "train")
    rows = [row for group in groups for row in group]
    assert len(groups) >= 2 and len(rows) > 80
    assert [path for path, _ in rows] != sorted(path for path, _ in rows)
    classes = len({label for _, label in rows})
    for group in groups:  # ~50 rows drawn from 10 classes, against 4-5 classes in path order
        assert len({label for _, label in group}) >= classes - 2, group
    # The seed decides the order: the same seed writes the same order (other parameters aside), another seed another.
    assert row_groups(s3_server, f"s3://{BUCKET}/out-order-b", "train") == groups
    other = [path for group in row_groups(s3_server, f"s3://{BUCKET}/out-order-c", "train") for path, _ in group]
    assert other != [path for path, _ in rows]


def test_too_many_bad_files_publishes_nothing(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-strict"
    summary, result = preprocess(s3_server, output, "--max-bad-fraction", "0.01", check=False)
    assert result.returncode == 3
    assert f"{len(BAD_FILES)} of {len(source_tree)} files could not be decoded" in result.stderr
    assert "maxBadFraction=0.01" in result.stderr and "bag/notes.txt" in result.stderr
    fs = s3fs(s3_server)
    assert fs.get_file_info(f"{BUCKET}/out-strict/_manifest.json").type == pafs.FileType.NotFound
    # The shards are done: accepting more bad files only repeats the final check.
    summary, result = preprocess(s3_server, output, "--max-bad-fraction", "0.05")
    assert summary["complete"] and "already done" in result.stderr


def test_missing_source_is_a_clear_error(s3_server, source_tree):
    env = {**os.environ, **s3_server.env()}
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", f"s3://{BUCKET}/nothing-here",
         "--output", f"s3://{BUCKET}/out-none"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 4
    assert "nothing-here does not exist" in result.stderr


def test_wrong_credentials_fail_without_echoing_them(s3_server, source_tree):
    env = {**os.environ, **s3_server.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_trainer.cli", "preprocess", "--source", SOURCE,
         "--output", f"s3://{BUCKET}/out-denied"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    assert "wrong-secret-value" not in result.stdout + result.stderr


def test_credentials_never_appear_in_logs_or_outputs(s3_server, source_tree):
    output = f"s3://{BUCKET}/out-secrets"
    _, result = preprocess(s3_server, output, "--shard-count", "2", "--shard-index", "0")
    _, result2 = preprocess(s3_server, output, "--shard-count", "2", "--shard-index", "1")
    logs = result.stdout + result.stderr + result2.stdout + result2.stderr
    fs = s3fs(s3_server)
    documents = b"".join(fs.open_input_stream(i.path).read() for i in fs.get_file_info(
        pafs.FileSelector(f"{BUCKET}/out-secrets", recursive=True)) if i.path.endswith(".json"))
    for secret in (s3_server.secret_key, s3_server.access_key):
        assert secret not in logs
        assert secret.encode() not in documents
