"""docs/architecture.md names every module of scalingrun_api, scalingrun_operator, scalingrun_demo and
scalingrun_trainer by its own path: in "The whole tree", the block of its top package has a line that starts with
the module's path under that package (`cluster/act.py`; a package's code: `builders/__init__.py`) and says what it
owns. A file of the same name in another folder does not name it, and a path that names no file is stale."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import module_map
from tests.support.env import ROOT

PAGE = ROOT / "docs" / "architecture.md"
TOPS = {"operator/scalingrun/": "scalingrun", "operator/scalingrun_api/": "scalingrun_api",
        "operator/scalingrun_operator/": "scalingrun_operator", "operator/scalingrun_demo/": "scalingrun_demo",
        "trainer/scalingrun_trainer/": "scalingrun_trainer"}
# A line of a block that names a file or folder: two spaces, its path, two spaces or more, what it owns.
NAMING_LINE = re.compile(r"  (?P<path>[\w/]+(?:\.py|/)) {2,}\S")


def whole_tree_blocks(page: str) -> dict[str, str]:
    """Top package -> the text of its block in the page's "The whole tree" code block."""
    section = page.split("## The whole tree", 1)[1].split("```", 2)[1]
    blocks: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        top = next((package for prefix, package in TOPS.items() if line.startswith(prefix)), None)
        if top:
            current = top
        elif line and not line.startswith(" "):
            current = None  # charts/, requirements/, scripts/ ...
        if current:
            blocks[current] = blocks.get(current, "") + line + "\n"
    return blocks


def named_paths(block: str) -> set[str]:
    return {match["path"] for match in map(NAMING_LINE.match, block.splitlines()) if match}


def unnamed(modules: dict[str, str], page: str) -> list[str]:
    """The modules (dotted name -> its path under its top package) that no line of their top package's block
    names by that path."""
    blocks = whole_tree_blocks(page)
    named = {top: named_paths(block) for top, block in blocks.items()}
    return [f"{name} ({path})" for name, path in modules.items() if path not in named.get(name.partition(".")[0], ())]


def module_paths() -> dict[str, str]:
    """Every module of the three packages -> its path under its top package's folder."""
    return {name: path.relative_to(ROOT / prefix).as_posix()
            for name, path in module_map.modules().items() if "." in name
            for prefix, top in TOPS.items() if name.partition(".")[0] == top}


def test_every_module_is_named_by_its_path_in_the_architecture_page():
    blocks = whole_tree_blocks(PAGE.read_text())
    assert set(blocks) == set(TOPS.values()), f"no block for {set(TOPS.values()) - set(blocks)}"
    missing = unnamed(module_paths(), PAGE.read_text())
    assert missing == [], f"docs/architecture.md's whole tree does not name, by its path: {missing}"


def test_a_file_of_the_same_name_elsewhere_does_not_name_a_module():
    page = ("## The whole tree\n\n```\noperator/scalingrun_api/   the API\n  a/           a folder\n"
            "  a/x.py       x in a\n  y.py         y at the top\n```\n")
    modules = {"scalingrun_api.a.x": "a/x.py", "scalingrun_api.b.x": "b/x.py", "scalingrun_api.y": "y.py",
               "scalingrun_api.a.y": "a/y.py"}
    assert unnamed(modules, page) == ["scalingrun_api.b.x (b/x.py)", "scalingrun_api.a.y (a/y.py)"]
    assert unnamed({"scalingrun_api.a.x": "a/x.py"}, page.replace("x in a", "")) == ["scalingrun_api.a.x (a/x.py)"]


def test_every_path_the_whole_tree_names_exists():
    """A module that moved or went leaves no line behind."""
    stale = sorted(f"{prefix}{path}" for prefix, top in TOPS.items()
                   for path in named_paths(whole_tree_blocks(PAGE.read_text()).get(top, ""))
                   if not (ROOT / prefix / path).exists())
    assert stale == []


def test_every_file_the_docs_name_under_tests_scripts_or_the_packages_exists():
    """A test file that moved leaves no stale path in the README or docs/."""
    pages = [ROOT / "README.md", ROOT / "charts/scalingrun/README.md", *sorted((ROOT / "docs").glob("*.md"))]
    stale = sorted({f"{page.relative_to(ROOT)}: {path}" for page in pages
                    for path in re.findall(r"(?<![\w/.-])((?:tests|scripts|bench)/[\w/.-]+\.(?:py|sh))", page.read_text())
                    if not (ROOT / path).exists()})
    assert stale == []
