"""The tests' layout holds: helpers live in tests/support/ (or conftest.py files), so no test module and no bench
script imports a test module or a conftest.py, and every folder of tests under tests/unit/ is a package."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.env import ROOT


def _imported_modules(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-node.level])
                module = package + ("." + module if module else "")
            out += [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
    return out


def test_no_test_module_or_bench_script_imports_a_test_module_or_a_conftest():
    found = []
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        for module in _imported_modules(path):
            last = module.rpartition(".")[2]
            if module.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                found.append(f"{path.relative_to(ROOT)} imports {module}: move what it needs to tests/support/")
    assert found == []


def test_every_folder_of_unit_tests_is_a_package():
    folders = {path.parent for path in (ROOT / "tests" / "unit").rglob("test_*.py")}
    assert [str(f.relative_to(ROOT)) for f in sorted(folders) if not (f / "__init__.py").exists()] == []
