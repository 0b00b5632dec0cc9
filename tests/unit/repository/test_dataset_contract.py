"""The dataset manifest's contract is defined once, in scalingrun_api.manifest (the package both sides install):
the parameters a dataset's content depends on, their format versions, and the one reader of the document. The
trainer's preprocessing records the parameters and the operator compares a run's against them with the same
functions; every path (operator, local runner, report, trainer) reads the manifest through DatasetManifest.read.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from scalingrun_api import manifest as contract
from scalingrun_operator.decide import preprocessing as operator_side
from scalingrun_operator import documents
from scalingrun_trainer.core.dataset import DatasetError, open_dataset
from scalingrun_trainer.preprocess import parquet_table, source

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = (ROOT / "operator", ROOT / "trainer")
CONTRACT = ROOT / "operator" / "scalingrun_api" / "manifest.py"
PARAMETER_KEYS = ("formatVersion", "minRowGroupsPerSplit")


def test_both_sides_use_the_same_definitions():
    assert source.image_dataset_parameters is contract.image_dataset_parameters
    assert operator_side.image_dataset_parameters is contract.image_dataset_parameters
    assert parquet_table.table_dataset_parameters is contract.table_dataset_parameters
    assert operator_side.table_dataset_parameters is contract.table_dataset_parameters
    assert parquet_table.TABLE_FORMAT is contract.TABLE_FORMAT


def test_the_recorded_parameters_carry_the_shared_format_versions():
    params = source.Params(source="s3://b/in", output="s3://b/out", image_size=64, max_readers=3)
    assert params.dataset_parameters()["formatVersion"] == contract.IMAGES_FORMAT_VERSION
    assert params.dataset_parameters()["minRowGroupsPerSplit"] == contract.ROW_GROUPS_PER_READER * 3
    table = parquet_table.TableParams(source="s3://b/t", output="s3://b/o", image_size=64, readers=2)
    assert table.dataset_parameters()["formatVersion"] == contract.TABLE_FORMAT_VERSION
    assert table.dataset_parameters()["format"] == contract.TABLE_FORMAT


def _modules() -> list[tuple[Path, ast.AST]]:
    return [(path, ast.parse(path.read_text(), str(path)))
            for package in SHIPPED for path in sorted(package.rglob("*.py"))]


MODULES = _modules()


@pytest.mark.parametrize("key", PARAMETER_KEYS)
def test_the_parameters_are_spelled_only_in_the_contract(key):
    spelled = {path for path, tree in MODULES for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value == key}
    assert spelled == {CONTRACT}, f"{key} is spelled in {sorted(map(str, spelled))}: use scalingrun_api.manifest"


def test_no_module_but_the_contract_defines_a_format_version():
    defined = {path for path, tree in MODULES for node in ast.walk(tree) if isinstance(node, ast.Assign)
               for target in node.targets if isinstance(target, ast.Name) and "FORMAT_VERSION" in target.id}
    assert defined == {CONTRACT}


def test_every_path_reads_the_manifest_with_the_one_reader():
    """DatasetManifest is parsed only by DatasetManifest.read: no model_validate of its own anywhere."""
    parsers = {(path.relative_to(ROOT).as_posix(), node.attr) for path, tree in MODULES for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
               and node.value.id == "DatasetManifest" and node.attr != "read"}
    assert parsers == set(), f"DatasetManifest parsed other than by DatasetManifest.read: {sorted(parsers)}"
    assert {path.relative_to(ROOT).as_posix() for path, tree in MODULES for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "read" and isinstance(node.value, ast.Name)
            and node.value.id == "DatasetManifest"} >= {
        "operator/scalingrun_operator/documents.py", "trainer/scalingrun_trainer/core/dataset.py"}
    assert documents.parse_manifest({"parameters": "junk", "source": "s3://b/in"}).source == "s3://b/in"


def test_the_trainer_reads_a_manifest_as_the_operator_does(tmp_path):
    """One junk field is left out, as the operator's reader leaves it out, and what the trainer needs must be there."""
    (tmp_path / contract.MANIFEST_FILE).write_text(json.dumps({"parameters": {"imageSize": 32}, "classes": ["a"],
                                                               "files": {"train": [], "validation": []},
                                                               "skipped": "junk"}))
    assert open_dataset(str(tmp_path)).image_size == 32
    (tmp_path / contract.MANIFEST_FILE).write_text(json.dumps({"parameters": {"imageSize": 32}, "files": "junk"}))
    with pytest.raises(DatasetError, match="not a complete dataset manifest"):
        open_dataset(str(tmp_path))
