"""Contracts spelled in one module each, checked on the source of the shipped packages (operator/ and trainer/;
tests, docs and bench/ may spell them): the dataset manifest's file name, the managed-by label, and every
framework and strategy name. Everything else imports the constant (or asks scalingrun_api.engines), so that a
rename or a new engine is one edit.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scalingrun_api.manifest import MANIFEST_FILE
from scalingrun_api.models import MANAGED_BY, Framework, Strategy

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = (ROOT / "operator", ROOT / "trainer")
(MANAGED_BY_LABEL,) = MANAGED_BY
# A file name or a label key is found inside any string (a docstring too); a framework or strategy name, which
# is also an English word ("keras"), only as a whole string.
ANYWHERE = {"manifest file": MANIFEST_FILE, "managed-by label": MANAGED_BY_LABEL}
WHOLE = {f"framework {f.value}": f.value for f in Framework} | {f"strategy {s.value}": s.value for s in Strategy}


def _strings() -> list[tuple[str, str]]:
    """(module path, string constant) of every string in the shipped packages' Python files."""
    found = []
    for package in SHIPPED:
        for path in sorted(package.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.append((str(path.relative_to(ROOT)), node.value))
    return found


STRINGS = _strings()


def spelled_in(what: str, strings: list[tuple[str, str]]) -> set[str]:
    """The modules whose strings spell `what`."""
    if what in ANYWHERE:
        return {path for path, text in strings if ANYWHERE[what] in text}
    return {path for path, text in strings if text == WHOLE[what]}


@pytest.mark.parametrize("what", sorted(ANYWHERE) + sorted(WHOLE))
def test_spelled_in_one_module(what):
    modules = spelled_in(what, STRINGS)
    assert len(modules) == 1, f"{what} is spelled in {sorted(modules)}: import its constant instead"


def test_a_second_spelling_is_found():
    again = STRINGS + [("elsewhere.py", Strategy.horovod.value), ("elsewhere.py", f"s3://b/out/{MANIFEST_FILE}"),
                       ("elsewhere.py", f"the {Strategy.horovod.value} engine")]
    assert len(spelled_in(f"strategy {Strategy.horovod.value}", again)) == 2
    assert len(spelled_in("manifest file", again)) == 2
