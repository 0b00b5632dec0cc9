"""The dataset published: whichever shard finds all n shard manifests (shards.py) checks the share of undecodable
files over the whole dataset, writes the dataset manifest and the class names (atomically; shardsReused counts the
shards kept from an earlier dataset) and removes the files that no longer belong to it. Readers take the file list
from the manifest, so nothing is visible before it exists."""

from __future__ import annotations

import json
import posixpath
from typing import Optional

from scalingrun_api.manifest import (CLASSES_FILE, MANIFEST_FILE, SHARDS_FOLDER, DatasetManifest, shard_count_suffix,
                                     shard_name)

from ..core.dataset import SPLITS
from ..storage import Location
from .plan import PLAN_FOLDER, Plan, read_json
from .source import Params, TooManyBadFiles


def finalize(params: Params, output: Location, plan: Plan) -> Optional[DatasetManifest]:
    """Writes the dataset manifest once every shard has finished; returns it, or None while shards remain."""
    shard_count, fp = len(plan.shards), plan.fingerprint
    shards = []
    for index in range(shard_count):
        done = read_json(output.join(SHARDS_FOLDER, f"{shard_name(index, shard_count)}.json"))
        if not done or done.get("shard_fingerprint") != plan.shards[index].fingerprint:
            return None
        shards.append(done)
    skipped = [x for d in shards for x in d["skipped_files"]]
    considered = sum(d["written"][s] for d in shards for s in SPLITS) + len(skipped)
    if considered and len(skipped) / considered > params.max_bad_fraction:
        # Judged on the whole dataset, not per shard; the shards stay done, so a rerun with a higher
        # maxBadFraction only repeats this step.
        raise TooManyBadFiles(
            f"{len(skipped)} of {considered} files could not be decoded (more than "
            f"maxBadFraction={params.max_bad_fraction}); no dataset was published. First: "
            + "; ".join(f"{x['path']}: {x['reason']}" for x in skipped[:3])
        )
    manifest = DatasetManifest(
        fingerprint=fp,
        parameters=params.dataset_parameters(),
        source=params.source,
        classes=plan.classes,
        source_files=plan.source_files,
        shards=shard_count,
        # Shards made for an earlier dataset whose files did not change (a grown tree rebuilds only the others).
        shards_reused=sum(1 for d in shards if d["fingerprint"] != fp),
        written={s: sum(d["written"][s] for d in shards) for s in SPLITS},
        skipped=len(skipped),
        skipped_files=skipped[:100],
        files={s: sorted(x for d in shards for x in d["files"][s]) for s in SPLITS},
    )
    output.join(CLASSES_FILE).write_bytes_atomic(json.dumps(plan.classes).encode())
    output.join(MANIFEST_FILE).write_bytes_atomic(json.dumps(manifest.document(), indent=1).encode())
    _remove_stale(output, manifest)
    return manifest


def _remove_stale(output: Location, manifest: DatasetManifest) -> None:
    """Deletes Parquet files, shard manifests, part records and plan chunks that are not part of this dataset."""
    keep = {posixpath.join(output.path, f) for s in SPLITS for f in manifest.files[s]}
    for folder in (*SPLITS, SHARDS_FOLDER, "_parts", PLAN_FOLDER):
        for info in output.join(folder).files(recursive=folder in ("_parts", PLAN_FOLDER)):
            if folder == SHARDS_FOLDER:
                stale = f"{shard_count_suffix(manifest.shards)}.json" not in info.base_name
            elif folder == PLAN_FOLDER:  # plans for another shard count, and an older format's chunks
                stale = info.base_name != "index.json" and (f"{shard_count_suffix(manifest.shards)}/" not in info.path
                                                            or not info.base_name.endswith(".jsonl"))
            elif folder == "_parts":
                stale = True  # every shard is done: their records are left over from attempts that died
            else:
                stale = info.path not in keep and not info.base_name.startswith("_tmp-")
            if stale:
                output.fs.delete_file(info.path)


def dataset_summary(manifest: DatasetManifest) -> dict:
    """The dataset's line in a shard's summary (the preprocess event)."""
    return {
        "event": "preprocess",
        "fingerprint": manifest.fingerprint,
        "classes": len(manifest.classes),
        "written": manifest.written,
        "skipped": manifest.skipped,
        "complete": True,
    }
