"""The plan (scalingrun_trainer.preprocess.plan) over a local tree: written in chunks, the same on a retry, every
file where source.assign puts it, and shard fingerprints that change only with their own files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalingrun_trainer.core.dataset import SPLITS
from scalingrun_trainer.preprocess import plan as planning
from scalingrun_trainer.preprocess.source import Params, SourceFile, assign, fingerprint
from scalingrun_trainer.storage import open_location

# "a" and "a-b": the folders' name order differs from their files' path order ("a-b/x" < "a/x").
CLASSES = ["a", "a-b", "cat", "dog"]
SHARDS = 3


def make_tree(root: Path, per_class: int = 20) -> list[str]:
    paths = []
    for name in CLASSES:
        for index in range(per_class):
            path = f"{name}/{'sub/' if index % 5 == 0 else ''}{index:03d}.jpg"
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(b"x" * (index + 1))
            paths.append(path)
    (root / "a" / ".hidden.jpg").write_bytes(b"no")
    (root / "_notes").mkdir()
    (root / "_notes" / "n.txt").write_bytes(b"no")
    return paths


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.setattr(planning, "PLAN_BUFFER_ROWS", 7)  # many chunks from a small tree
    paths = make_tree(tmp_path / "src")
    params = Params(str(tmp_path / "src"), str(tmp_path / "out"), image_size=8, validation_fraction=0.3)
    return params, paths


def write(params: Params, plan_id: str = "job-1") -> planning.Plan:
    return planning.write_plan(params, open_location(params.source), open_location(params.output), SHARDS, plan_id)


def test_every_file_goes_where_assign_puts_it_and_the_fingerprint_is_the_whole_listings(tree):
    params, paths = tree
    plan = write(params)
    assert plan.classes == CLASSES and plan.source_files == len(paths)
    assert sum(s.chunks for s in plan.shards) > SHARDS  # flushed every 7 planned files
    output = open_location(params.output)
    seen = []
    for shard in range(SHARDS):
        files = list(planning.shard_stream(output, plan, shard))
        splits = [f.split for f in files]
        assert splits == sorted(splits, key=SPLITS.index)  # train, then validation
        for split in SPLITS:
            mine = [f for f in files if f.split == split]
            assert len(mine) == plan.shards[shard].rows[split]
            assert [f.place for f in mine] == sorted(f.place for f in mine)
        for f in files:
            a = assign(f.path, params.seed, params.sample_fraction, params.validation_fraction, SHARDS)
            assert (a.split, a.shard, a.place) == (f.split, shard, f.place)
            assert CLASSES[f.label] == f.path.split("/")[0]
            seen.append(f.path)
    assert sorted(seen) == sorted(paths)  # hidden files and "_" folders left out
    listing = sorted((SourceFile(p, int(p.split("/")[-1][:3]) + 1, CLASSES.index(p.split("/")[0])) for p in paths),
                     key=lambda f: f.path)
    assert plan.fingerprint == fingerprint(params, CLASSES, listing)


def test_a_shard_reads_its_chunks_a_block_at_a_time_with_the_same_result(tree, monkeypatch):
    params, _ = tree
    plan = write(params)
    output = open_location(params.output)
    whole = [list(planning.shard_stream(output, plan, shard)) for shard in range(SHARDS)]
    # Blocks of 5 bytes: every line is cut across blocks, and the merge holds a few bytes of each chunk.
    monkeypatch.setattr(planning, "MERGE_READ_BYTES", 1)
    monkeypatch.setattr(planning, "MIN_READ_BLOCK", 5)
    assert [list(planning.shard_stream(output, plan, shard)) for shard in range(SHARDS)] == whole
    assert all(plan.shards[shard].chunks > 1 for shard in range(SHARDS))


def test_an_older_trainers_plan_is_planned_again(tree):
    params, _ = tree
    write(params)
    output = open_location(params.output)
    index = output.join(planning.PLAN_FOLDER, "index.json")
    document = planning.read_json(index)
    del document["format"]  # format 1: chunks were unsorted JSON arrays
    index.write_bytes_atomic(json.dumps(document).encode())
    assert planning.read_plan(output, params, SHARDS, "job-1") is None


def test_a_retried_planner_writes_the_same_plan(tree):
    params, _ = tree
    write(params)
    first = files_under(Path(params.output) / planning.PLAN_FOLDER)
    write(params)
    assert files_under(Path(params.output) / planning.PLAN_FOLDER) == first
    output = open_location(params.output)
    assert planning.read_plan(output, params, SHARDS, "job-1") is not None
    assert planning.read_plan(output, params, SHARDS, "job-2") is None  # another Job's shards wait for their own
    assert planning.read_plan(output, params, SHARDS + 1, "job-1") is None


def test_a_new_file_changes_only_its_shards_fingerprint(tree):
    params, _ = tree
    before = write(params)
    new = "dog/new-one.jpg"
    (Path(params.source) / new).write_bytes(b"new")
    after = write(params)
    changed = [i for i in range(SHARDS) if before.shards[i].fingerprint != after.shards[i].fingerprint]
    assert changed == [assign(new, params.seed, 1.0, params.validation_fraction, SHARDS).shard]
    assert after.fingerprint != before.fingerprint


def test_the_plan_id_is_the_flag_else_the_newer_job_label_else_the_legacy_one():
    from scalingrun_trainer.cli import plan_id_from

    newer, legacy = "SCALINGRUN_PLAN_ID", "SCALINGRUN_PLAN_ID_LEGACY"
    # Kubernetes 1.27+ sets both labels to the Job's uid; an older server only the legacy one (the other variable
    # arrives empty); a later one may drop the legacy label.
    assert plan_id_from(None, {newer: "uid-a", legacy: "uid-a"}) == "uid-a"
    assert plan_id_from(None, {newer: "", legacy: "uid-b"}) == "uid-b"
    assert plan_id_from(None, {newer: "uid-c", legacy: ""}) == "uid-c"
    assert plan_id_from(None, {newer: "uid-c"}) == "uid-c"
    assert plan_id_from("given", {newer: "uid-d", legacy: "uid-d"}) == "given"
    # No id at all: every call plans for itself (a local run without --plan-id).
    assert plan_id_from(None, {newer: "", legacy: ""}) is None
    assert plan_id_from(None, {}) is None
