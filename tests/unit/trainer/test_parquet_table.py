"""dataset.format parquet: `scalingrun-trainer inspect` on tables written with pyarrow directly (not our
preprocessing): what fits is described in our manifest and read by the readers; what does not is refused with
the column named."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalingrun_trainer.core.dataset import open_dataset
from scalingrun_trainer.preprocess.parquet_table import TableError, inspect_table, write_manifest
from tests.support.parquet_table import SIDE, params, write_table


def test_a_pyarrow_table_is_described_and_read_by_the_readers(tmp_path):
    root = write_table(tmp_path / "table", files=2)
    (root / "train" / "_delta_log").mkdir()
    (root / "train" / "_delta_log" / "00000.parquet").write_bytes(b"not parquet")  # hidden: not read
    (root / "_classes.json").write_text(json.dumps(["cat", "dog", "bird"]))
    result = subprocess.run([sys.executable, "-m", "scalingrun_trainer.cli", "inspect", "--source", str(root),
                             "--output", str(tmp_path / "out"), "--image-size", str(SIDE), "--image-column", "pixels",
                             "--label-column", "y", "--max-readers", "2"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["written"] == {"train": 80, "validation": 40} and summary["classes"] == 3
    assert summary["rowGroups"] == {"train": 16, "validation": 8} and summary["warnings"] == []
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["files"]["train"] == ["train/part-0.parquet", "train/part-1.parquet"]
    assert manifest["classes"] == ["cat", "dog", "bird"] and manifest["dataRoot"] == str(root)
    dataset = open_dataset(str(tmp_path / "out"))
    assert dataset.uri == str(root) and dataset.columns == {"image": "pixels", "label": "y"}
    assert dataset.row_groups == {"train": 16, "validation": 8} and dataset.image_size == SIDE
    assert dataset.urls("validation")[0] == f"file://{root}/validation/part-0.parquet"


def test_a_missing_label_column_is_named(tmp_path):
    root = write_table(tmp_path / "table", label="target")
    with pytest.raises(TableError) as caught:
        inspect_table(params(root, tmp_path))
    message = str(caught.value)
    assert message.startswith("spec.dataset.columns.label: column 'y' is not in ")
    assert "its columns: pixels, target, note" in message


def test_the_command_fails_naming_the_column_and_forgets_an_earlier_manifest(tmp_path):
    root = write_table(tmp_path / "table")
    good = params(root, tmp_path)
    from scalingrun_trainer.preprocess.parquet_table import write_manifest

    write_manifest(good, inspect_table(good))
    (root / "train" / "part-0.parquet").unlink()
    write_table(tmp_path / "table", image="img")
    result = subprocess.run([sys.executable, "-m", "scalingrun_trainer.cli", "inspect", "--source", str(root),
                             "--output", str(tmp_path / "out"), "--image-size", str(SIDE), "--image-column", "pixels",
                             "--label-column", "y", "--max-readers", "2"], capture_output=True, text=True)
    assert result.returncode == 5
    assert "spec.dataset.columns.image: column 'pixels' is not in" in json.loads(result.stdout.splitlines()[-1])["error"]
    assert not (tmp_path / "out" / "_manifest.json").exists()


@pytest.mark.parametrize("table,words", [
    ({"image_type": pa.string()}, "spec.dataset.columns.image: column 'pixels'"),
    ({"label_type": pa.float64()}, "spec.dataset.columns.label: column 'y'"),
    ({"label_type": pa.string(), "labels": [str(i % 3) for i in range(40)]}, "must be an integer"),
    ({"side": 6}, "have 108 bytes (that is 6 x 6 x 3); spec.dataset.imageSize 32 needs 3072"),
    ({"image_type": pa.binary(6 * 6 * 3), "side": 6}, "imageSize 32 needs 3072"),
    ({"labels": [None] + [1] * 39}, "1 empty (null) labels"),
    ({"labels": [-1] + [1] * 39}, "has label -1"),
    ({"labels": [0] * 40}, "only label 0"),
    ({"row_group_size": 40}, "train: 1 row groups for 2 processes"),
])
def test_a_table_that_does_not_fit_is_refused_saying_why(tmp_path, table, words):
    if table.get("image_type") == pa.string():
        root = tmp_path / "table"
        for split in ("train", "validation"):
            (root / split).mkdir(parents=True)
            pq.write_table(pa.table({"pixels": ["a"] * 10, "y": [0, 1] * 5}), root / split / "p.parquet",
                           row_group_size=2)
    else:
        root = write_table(tmp_path / "table", **table)
    with pytest.raises(TableError) as caught:
        inspect_table(params(root, tmp_path))
    assert words in str(caught.value)


def test_fixed_size_binary_images_and_few_row_groups_warn_but_pass(tmp_path):
    root = write_table(tmp_path / "table", image_type=pa.binary(SIDE * SIDE * 3), row_group_size=10)
    manifest = inspect_table(params(root, tmp_path))
    assert manifest.row_groups == {"train": 4, "validation": 2}
    assert manifest.warnings == ["validation has 2 row groups for 2 processes: fewer than 2 per process leaves "
                                    "little to shuffle and to balance; write smaller row groups"]
    assert manifest.classes == ["0", "1", "2"]


def test_training_rows_in_class_order_warn_and_a_random_order_does_not(tmp_path):
    in_order = sorted(i % 4 for i in range(200))
    mixed = np.random.default_rng(1).permutation(in_order).tolist()
    sorted_table = inspect_table(params(write_table(tmp_path / "sorted", rows=200, labels=in_order), tmp_path))
    assert [w for w in sorted_table.warnings if w.startswith("train: ")] == [
        "train: 98% of consecutive rows have the same label (25% in a random order): the rows look sorted by class, "
        "and the readers shuffle across a few row groups at a time, so batches would hold one or two classes and "
        "train worse; write the rows in a random order (pyarrow: "
        "table.take(numpy.random.default_rng(0).permutation(len(table))))"]
    mixed_table = inspect_table(params(write_table(tmp_path / "mixed", rows=200, labels=mixed), tmp_path))
    assert mixed_table.warnings == []


@pytest.mark.parametrize("image_type", [pa.binary(), pa.binary(SIDE * SIDE * 3)], ids=["binary", "fixed-size"])
def test_the_trainers_reader_reads_the_tables_own_columns(tmp_path, image_type):
    from scalingrun_trainer.frameworks.keras.data import make_dataset

    root = write_table(tmp_path / "table", image_type=image_type, label_type=pa.int8())
    write_manifest(params(root, tmp_path), inspect_table(params(root, tmp_path)))
    data, reader = make_dataset(open_dataset(str(tmp_path / "out")), "validation", rank=0, size=1, batch_size=8,
                                seed=0)
    try:
        pixels, labels = (np.concatenate(parts) for parts in zip(*((x.numpy(), y.numpy()) for x, y in data)))
    finally:
        reader.stop()
        reader.join()
    # What write_table wrote into validation/part-0.parquet (its row groups may arrive in any order).
    rng = np.random.default_rng(0)
    [rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(40)]  # the train split's images
    expected = [(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8).tobytes(), i % 3) for i in range(20)]
    assert pixels.shape == (20, SIDE, SIDE, 3) and pixels.dtype == np.uint8
    assert sorted((image.tobytes(), int(label)) for image, label in zip(pixels, labels)) == sorted(expected)


def test_the_fingerprint_follows_the_files_and_the_parameters(tmp_path):
    root = write_table(tmp_path / "table")
    first = inspect_table(params(root, tmp_path)).fingerprint
    assert inspect_table(params(root, tmp_path)).fingerprint == first
    assert inspect_table(params(root, tmp_path, readers=1)).fingerprint != first
    write_table(tmp_path / "table", rows=50)
    assert inspect_table(params(root, tmp_path)).fingerprint != first


def test_missing_split_folders_are_named(tmp_path):
    root = write_table(tmp_path / "table")
    for path in (root / "validation").iterdir():
        path.unlink()
    (root / "validation").rmdir()
    from scalingrun_trainer.preprocess.source import SourceError

    with pytest.raises(SourceError, match="validation is not a folder"):
        inspect_table(params(root, tmp_path))


def test_the_check_leaves_its_manifest_where_the_operator_reads_it_with_push_on(tmp_path, monkeypatch):
    from scalingrun_api.manifest import DatasetManifest
    from scalingrun_operator.decide.pods import manifest_left
    from scalingrun_trainer import cli

    root = write_table(tmp_path / "table")
    (tmp_path / "termination-log").touch()  # as the kubelet makes it
    monkeypatch.setattr(cli, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert cli.main(["inspect", "--source", str(root), "--output", str(tmp_path / "out"), "--image-size", str(SIDE),
                     "--image-column", "pixels", "--label-column", "y", "--max-readers", "2"]) == 0
    written = DatasetManifest.read(json.loads((tmp_path / "out" / "_manifest.json").read_text()))
    job = {"apiVersion": "batch/v1", "kind": "Job", "name": "r-preprocess", "uid": "job-uid", "controller": True}
    pod = {"metadata": {"name": "r-preprocess-0", "labels": {"app.kubernetes.io/component": "preprocess"},
                        "ownerReferences": [job]},
           "status": {"containerStatuses": [{"name": "preprocess", "state": {"terminated": {
               "exitCode": 0, "message": (tmp_path / "termination-log").read_text()}}}]}}
    left = manifest_left([pod], "job-uid")
    assert left.document() == {**written.document(), "files": {}}  # all the operator uses, without the file lists
    assert left.row_groups == written.row_groups and left.fingerprint == written.fingerprint


def test_a_shard_leaves_the_manifest_only_when_it_is_the_datasets_it_made(tmp_path, monkeypatch):
    from scalingrun_api.manifest import DatasetManifest, manifest_from_termination_message
    from scalingrun_trainer import cli
    from scalingrun_trainer.preprocess.source import Params

    monkeypatch.setattr(cli, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "_manifest.json").write_text(json.dumps(
        DatasetManifest(fingerprint="a" * 16, classes=["cat", "dog"], written={"train": 4}).document()))
    shard = Params(source=str(tmp_path / "raw"), output=str(tmp_path / "out"))
    cli._leave_manifest(shard, "a" * 16)  # outside a pod (no file from the kubelet): nothing written
    assert not (tmp_path / "termination-log").exists()
    (tmp_path / "termination-log").touch()
    cli._leave_manifest(shard, "b" * 16)  # an earlier dataset's manifest: not this one's
    assert (tmp_path / "termination-log").read_text() == ""
    cli._leave_manifest(shard, "a" * 16)
    left = manifest_from_termination_message((tmp_path / "termination-log").read_text())
    assert (left.fingerprint, left.classes, left.written) == ("a" * 16, ["cat", "dog"], {"train": 4})
