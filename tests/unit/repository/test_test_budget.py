"""scripts/test_budget.py, the table scripts/test.sh ends with: its phases in the order they started, and the slowest
tests of every phase's junit report (a report cut short by a killed phase is left out, not fatal)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.support.env import ROOT

spec = importlib.util.spec_from_file_location("test_budget", ROOT / "scripts/test_budget.py")
budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(budget)


def _junit(cases: list[tuple[str, str, float]]) -> str:
    body = "".join(f'<testcase classname="{c}" name="{n}" time="{t}"/>' for c, n, t in cases)
    return f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>'


def test_phases_in_start_order_and_the_slowest_tests_across_phases(tmp_path):
    (tmp_path / "phases.tsv").write_text("setup\t0\t12\t0\nunit\t12\t95\t0\nbuild: API server\t12\t400\t0\n"
                                         "integration\t412\t1500\t1\nin all\t0\t2900\t1\n")
    (tmp_path / "unit.xml").write_text(_junit([("tests.unit.test_a", "test_fast", 0.5),
                                               ("tests.unit.test_a", "test_slow", 30.0)]))
    (tmp_path / "integration.xml").write_text(_junit([("tests.integration.test_b", "test_slowest@training-1", 120.25)]))
    (tmp_path / "e2e.xml").write_text("<testsuites><testsuite")  # the e2e killed mid-write
    lines = budget.render(tmp_path, slowest=2).splitlines()
    assert lines[3:8] == ["| setup | 0 s | 12 s | 0 |", "| unit | 12 s | 1 min 35 s | 0 |",
                          "| build: API server | 12 s | 6 min 40 s | 0 |", "| integration | 6 min 52 s | 25 min 00 s | 1 |",
                          "| in all | 0 s | 48 min 20 s | 1 |"]
    assert "e2e: its junit report is incomplete (the phase was cut short); its tests are not counted" in lines
    assert "3 tests reported; the 2 slowest (setup, call and teardown):" in lines
    slowest = [line for line in lines if line.startswith("| tests.")]
    assert slowest == ["| tests.integration.test_b::test_slowest | integration | 120.2 s |",
                       "| tests.unit.test_a::test_slow | unit | 30.0 s |"]


def test_the_command_line_prints_the_table(tmp_path):
    (tmp_path / "phases.tsv").write_text("setup\t0\t3\t0\n")
    result = subprocess.run([sys.executable, str(ROOT / "scripts/test_budget.py"), str(tmp_path)],
                            capture_output=True, text=True, check=True)
    assert result.stdout.startswith("== test budget ==\n| phase | started at | took | exit |")
    assert "| setup | 0 s | 3 s | 0 |" in result.stdout and "0 tests reported" in result.stdout
