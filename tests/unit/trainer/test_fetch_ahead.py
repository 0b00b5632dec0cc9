"""Fetching ahead (preprocess/decoding.py): a decoding process downloads a batch of objects at once and decodes them
in order as they arrive; the dataset is the same byte for byte as one GET at a time."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from scalingrun_trainer.preprocess import decoding
from scalingrun_trainer.preprocess.shards import Params, process_shard
from scalingrun_operator.local.sample_data import fashion_mnist_jpegs


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tree")
    for relative, data in fashion_mnist_jpegs(5):
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    (folder / "bag" / "broken.jpg").write_bytes(b"not a jpeg")  # counted as skipped, in its place
    return folder


def preprocessed(tree: Path, output: Path, **options) -> tuple[dict, list]:
    summary = process_shard(Params(str(tree), str(output), image_size=8, validation_fraction=0.3,
                                   max_bad_fraction=0.1), 0, 1, **options)
    rows = []
    for split in ("train", "validation"):
        for part in sorted((output / split).glob("*.parquet")):
            rows += [(split, *row.values()) for row in pq.read_table(part).to_pylist()]
    return summary, rows


def test_the_dataset_is_the_same_fetched_ahead_in_one_or_two_processes(tree, tmp_path):
    summary, rows = preprocessed(tree, tmp_path / "one-by-one", workers=1, fetch_ahead=1)
    assert summary["skipped"] == 1 and len(rows) == 50
    for name, options in {"ahead": {"workers": 1, "fetch_ahead": 8},
                          "two-processes": {"workers": 2, "fetch_ahead": 3}}.items():
        other_summary, other_rows = preprocessed(tree, tmp_path / name, **options)
        assert other_rows == rows, name
        assert (other_summary["written"], other_summary["skipped"], other_summary["skippedFiles"]) == \
            (summary["written"], summary["skipped"], summary["skippedFiles"]), name


def test_a_batch_s_gets_are_in_flight_together(tree, tmp_path, monkeypatch):
    """Every GET of the first batch starts before any of them returns: none waits for the one before it."""
    ahead = 4
    started, all_started = [], threading.Event()
    fetch = decoding._fetch

    def fetch_after_the_others_start(planned):
        started.append(planned.path)
        if len(started) == ahead:
            all_started.set()
        assert all_started.wait(timeout=60), f"only {len(started)} of {ahead} GETs were in flight together"
        return fetch(planned)

    monkeypatch.setattr(decoding, "_fetch", fetch_after_the_others_start)
    summary, rows = preprocessed(tree, tmp_path / "out", workers=1, fetch_ahead=ahead)
    assert len(rows) == 50 and summary["skipped"] == 1
