"""Our packages' import graph, read from the source (nothing is imported): what the operator's and the trainer's
structure tests (tests/unit/operator/test_structure.py, tests/unit/trainer/test_trainer_structure.py) check their layers on."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional


def modules(root: Path, package: Optional[str] = None) -> Iterator[tuple[str, Path, ast.Module]]:
    """(dotted name, path, syntax tree) of every module under `root` (a folder holding packages), or only of
    `package` and its submodules."""
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if package is None or name == package or name.startswith(package + "."):
            yield name, path, ast.parse(path.read_text(), str(path))


def imports(name: str, path: Path, tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import, those inside functions and `if TYPE_CHECKING:` too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # `from . import pods` imports the module pods
                yield node.lineno, f"{target}.{alias.name}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (a `from x import name` whose name is no module counts as x)."""
    found = list(modules(root, package))
    known = {name for name, _, _ in found}
    graph: dict[str, set[str]] = {}
    for name, path, tree in found:
        targets = graph.setdefault(name, set())
        for _, target in imports(name, path, tree):
            if target in known and target != name:
                targets.add(target)
    return graph
