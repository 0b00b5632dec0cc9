"""The install, upgrade and uninstall commands the docs give are one command each, written the same on every page
(issue 52, item 5), and every flag they use is one the helm of scripts/tools.sh knows. Running them against a
cluster is the e2e's upgrade test, not this one."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.chart import ROOT, helm  # noqa: F401 (fixture)

PAGES = ["README.md", "docs/install.md", "docs/run-in-a-cluster.md", "charts/scalingrun/README.md"]
COMMANDS = {
    "install": "helm install scalingrun charts/scalingrun -n scalingrun-system --create-namespace",
    "upgrade": "helm upgrade scalingrun charts/scalingrun -n scalingrun-system --reset-then-reuse-values",
    "uninstall": "helm uninstall scalingrun -n scalingrun-system",
}
FENCE = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.S | re.M)
COMMAND = re.compile(r"^helm (install|upgrade|uninstall) scalingrun\b.*$", re.M)


def documented() -> list[tuple[str, str, str]]:
    """(page, verb, command without its comment and continuation) of each helm command in a bash fence."""
    found = []
    for page in PAGES:
        for block in FENCE.findall((ROOT / page).read_text()):
            for match in COMMAND.finditer(block):
                command = match.group(0).split("#", 1)[0].rstrip().removesuffix("\\").rstrip()
                found.append((page, match.group(1), command))
    return found


def test_every_page_gives_each_command_as_written_once() -> None:
    found = documented()
    assert {verb for _, verb, _ in found} == set(COMMANDS)
    wrong = [(page, command) for page, verb, command in found if command != COMMANDS[verb]]
    assert not wrong, f"written otherwise than {COMMANDS}: {wrong}"


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_the_flags_exist(helm: str, verb: str) -> None:  # noqa: F811 (fixture)
    usage = subprocess.run([helm, verb, "--help"], capture_output=True, text=True, check=True).stdout
    for flag in re.findall(r"\s(--?[a-z][a-z-]*)", COMMANDS[verb]):
        assert re.search(rf"(^|[\s,]){re.escape(flag)}[\s=,]", usage, re.M), f"helm {verb} has no {flag}"
