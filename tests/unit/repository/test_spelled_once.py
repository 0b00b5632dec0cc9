"""Contracts spelled in one module each, checked on the source of the shipped packages (operator/ and trainer/;
tests, docs and bench/ may spell them): the dataset manifest's file name, the managed-by label, every
framework and strategy name, the MPIJob's group, version and plural, and the kinds of document the trainer
pushes and decide reads. Everything else imports the constant (or asks scalingrun_api.engines), so that a rename
or a new engine is one edit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scalingrun_api.manifest import MANIFEST_FILE
from scalingrun_api.models import MANAGED_BY, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION, Framework, Strategy
from scalingrun_api.status_push import HEARTBEAT, PROGRESS
from scalingrun_operator.decide.snapshot import MANIFEST

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = (ROOT / "operator", ROOT / "trainer")
(MANAGED_BY_LABEL,) = MANAGED_BY
# A file name or a label key is found inside any string (a docstring too); a framework or strategy name, which
# is also an English word ("keras"), only as a whole string.
ANYWHERE = {"manifest file": MANIFEST_FILE, "managed-by label": MANAGED_BY_LABEL}
WHOLE = {f"framework {f.value}": f.value for f in Framework} | {f"strategy {s.value}": s.value for s in Strategy}
WHOLE |= {"MPIJob group": MPIJOB_GROUP, "MPIJob version": MPIJOB_VERSION, "MPIJob plural": MPIJOB_PLURAL}
# A document kind is also a word, and names status fields too (a run's status.training.heartbeat, a sweep's
# status.progress) and the sdk's heartbeat(): a mapping's key and a name in __all__ are those, not kinds.
KINDS = {f"document kind {kind}": kind for kind in (PROGRESS, HEARTBEAT, MANIFEST)}


def _keys(tree: ast.AST) -> set[int]:
    """The ids of the strings that are a mapping's key (`status["progress"]`, `status.get("progress")`) or a name
    in `__all__`."""
    keys = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            keys.add(id(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            keys.update(id(argument) for argument in node.args[:1])
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            keys.update(id(name) for name in ast.walk(node.value))
    return keys


def module_strings(source: str, module: str, keys: bool = True) -> list[tuple[str, str]]:
    """(module, string constant) of every string in `source`; without mapping keys and __all__ when not `keys`."""
    tree = ast.parse(source, module)
    left_out = set() if keys else _keys(tree)
    return [(module, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in left_out]


def _strings(keys: bool = True) -> list[tuple[str, str]]:
    """(module path, string constant) of every string in the shipped packages' Python files."""
    return [found for package in SHIPPED for path in sorted(package.rglob("*.py"))
            for found in module_strings(path.read_text(), str(path.relative_to(ROOT)), keys)]


STRINGS = _strings()
KIND_STRINGS = _strings(keys=False)


def spelled_in(what: str, strings: list[tuple[str, str]]) -> set[str]:
    """The modules whose strings spell `what`."""
    if what in ANYWHERE:
        return {path for path, text in strings if ANYWHERE[what] in text}
    return {path for path, text in strings if text == (WHOLE | KINDS)[what]}


@pytest.mark.parametrize("what", sorted(ANYWHERE) + sorted(WHOLE) + sorted(KINDS))
def test_spelled_in_one_module(what):
    modules = spelled_in(what, KIND_STRINGS if what in KINDS else STRINGS)
    assert len(modules) == 1, f"{what} is spelled in {sorted(modules)}: import its constant instead"


def test_a_second_spelling_is_found():
    again = STRINGS + [("elsewhere.py", Strategy.horovod.value), ("elsewhere.py", f"s3://b/out/{MANIFEST_FILE}"),
                       ("elsewhere.py", f"the {Strategy.horovod.value} engine")]
    assert len(spelled_in(f"strategy {Strategy.horovod.value}", again)) == 2
    assert len(spelled_in("manifest file", again)) == 2


def test_a_document_kind_spelled_again_is_found_and_a_status_field_is_not():
    again = KIND_STRINGS + module_strings(
        f'pusher.push("{HEARTBEAT}", beat)\nstatus["{PROGRESS}"] = status.get("{HEARTBEAT}")\n'
        f'__all__ = ["{HEARTBEAT}"]\n', "elsewhere.py", keys=False)
    assert spelled_in(f"document kind {HEARTBEAT}", again) == {"elsewhere.py", "operator/scalingrun_api/status_push.py"}
    assert "elsewhere.py" not in spelled_in(f"document kind {PROGRESS}", again)
