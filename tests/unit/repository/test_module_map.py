"""docs/testing.md's module -> tests map is complete and current: every module of the shipped packages has a
row, and each row names the test files that import the module (tests/support/module_map.py writes it)."""

from __future__ import annotations

import ast

from tests.support import module_map


def test_the_page_holds_the_map_as_the_tests_import_the_modules_today():
    page = module_map.PAGE.read_text()
    assert module_map.BEGIN in page and module_map.END in page, f"no map in {module_map.PAGE}"
    assert module_map.page_with_map(page) == page, (
        f"{module_map.PAGE.name}'s module -> tests map is stale: run python -m tests.support.module_map --write")


def test_every_module_has_a_row():
    page = module_map.PAGE.read_text()
    missing = [m for m in module_map.modules() if f"| `{m}` |" not in page]
    assert missing == []


def test_a_from_import_of_a_module_counts_that_module_and_of_a_name_its_module(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from .c import Thing\n")
    known = {"pkg.a": None, "pkg.a.b": None, "pkg": init, "pkg.c": None}
    tree = ast.parse("from pkg.a import b, thing\nimport pkg.a.thing\nfrom pkg import Thing\n")
    assert module_map._imported(tree, known) == {"pkg.a.b", "pkg.a", "pkg", "pkg.c"}
