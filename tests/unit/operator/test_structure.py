"""The operator's structure, checked on its source so that it cannot regress: imports point down only, decide
is pure, no module keeps mutable state at module level, no file is longer than 400 lines.

The layers, bottom first (a module may import its own layer and the ones below; docs/architecture.md
draws them): the API, the builders of children, decide, the shared I/O helpers, then the cluster side and
the local runner (siblings that never import each other), the kopf handlers, the entry points.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional

import pytest

from tests.support import import_graph
from tests.support.import_graph import cycles, imports, module_graph

OPERATOR = Path(__file__).resolve().parents[3] / "operator"
LAYERS = [
    ("scalingrun_api",),
    ("scalingrun_operator.schema",),
    ("scalingrun_operator.builders",),
    ("scalingrun_operator.decide",),
    ("scalingrun_operator.clock", "scalingrun_operator.config", "scalingrun_operator.pull",
     "scalingrun_operator.object_store", "scalingrun_operator.document_source", "scalingrun_operator.documents",
     "scalingrun_operator.report",
     "scalingrun_operator.status_server", "scalingrun_operator.push_admission", "scalingrun_operator.pushed",
     "scalingrun_operator.serving_certificate"),
    ("scalingrun_operator.cluster", "scalingrun_operator.local"),
    ("scalingrun_operator.handlers",),
    ("scalingrun_operator.main", "scalingrun_operator.cli"),
    ("scalingrun_demo",),  # the cluster quick start: uses the operator, which never imports it
    ("scalingrun",),  # the Python client: above the command line, whose cluster and loading code it reuses
]
APART = {"scalingrun_operator.cluster": "scalingrun_operator.local", "scalingrun_operator.local": "scalingrun_operator.cluster"}
OURS = ("scalingrun", "scalingrun_api", "scalingrun_operator", "scalingrun_trainer", "scalingrun_demo")
# decide reads no clock and does no I/O: none of these, directly.
IMPURE = ("kubernetes", "kopf", "botocore", "boto3", "urllib3", "requests", "aiohttp", "time", "os", "subprocess",
          "threading", "socket", "random", "shutil", "asyncio", "pyarrow", "scalingrun_trainer")
CLOCK_CALLS = {"now", "utcnow", "today", "monotonic", "perf_counter", "time"}
MAX_LINES = 400
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
            "remove", "move_to_end", "sort", "reverse", "inc", "dec", "set", "observe", "labels"}
# Module-level calls that make nothing mutable.
IMMUTABLE_CALLS = {"getLogger", "TypeVar", "compile", "frozenset", "tuple", "MappingProxyType", "Where", "Settings",
                   "PhaseTable", "Field", "sysconf", "timedelta"}


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    return import_graph.modules(OPERATOR)


def layer(module: str) -> Optional[tuple[int, str]]:
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    return best


def test_every_module_has_a_layer():
    missing = [name for name, _, _ in modules() if name != "scalingrun_operator" and layer(name) is None]
    assert missing == [], f"modules in no layer of {__name__}.LAYERS: {missing}"


def test_imports_point_down_only():
    wrong = []
    for name, path, tree in modules():
        here = layer(name)
        if here is None:
            continue
        for line, target in imports(name, path, tree):
            if target.split(".")[0] not in OURS:
                continue
            if target.startswith("scalingrun_trainer"):  # the local runner starts it as processes, never imports it
                wrong.append(f"{path.name}:{line} {name} imports the trainer ({target})")
                continue
            there = layer(target)
            if there is None:  # `from .x import name`: the name is not a module
                continue
            if there[0] > here[0]:
                wrong.append(f"{path.relative_to(OPERATOR)}:{line} {name} (layer {here[0]}) imports {target} "
                             f"(layer {there[0]})")
            elif APART.get(here[1]) == there[1]:
                wrong.append(f"{path.relative_to(OPERATOR)}:{line} {name} imports its sibling {target}")
    assert wrong == []


def test_no_import_cycles():
    """Neither the operator nor the API package it shares with the trainer imports itself in a circle."""
    for package in ("scalingrun_operator", "scalingrun_api"):
        assert cycles(module_graph(OPERATOR, package)) == [], package


# Pull mode (deprecated) lives in scalingrun_operator.pull; the reconcile chooses it (its one way in) and observe
# reads documents through document_source.py's protocol. The tools read stores with object_store.py, their own.
PULL_CHOOSER = "scalingrun_operator.cluster.reconcile"


def test_only_the_reconcile_chooses_pull_mode_and_nothing_else_knows_its_storage_client():
    found = sorted({name for name, path, tree in modules() if not name.startswith("scalingrun_operator.pull")
                    for _, target in imports(name, path, tree) if target.startswith("scalingrun_operator.pull")})
    assert found == [PULL_CHOOSER]


def test_decide_is_pure():
    found = []
    for name, path, tree in modules():
        if not name.startswith("scalingrun_operator.decide"):
            continue
        for line, target in imports(name, path, tree):
            if target.split(".")[0] in IMPURE:
                found.append(f"{path.name}:{line} imports {target}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in CLOCK_CALLS):
                found.append(f"{path.name}:{node.lineno} reads a clock ({ast.unparse(node.func)})")
    assert found == []


@pytest.mark.parametrize("limit", [MAX_LINES])
def test_no_file_is_longer_than_400_lines(limit):
    long = {str(path.relative_to(OPERATOR)): n for _, path, _ in modules()
            if (n := len(path.read_text().splitlines())) > limit}
    assert long == {}


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """The statements that run at import: the module's, and those inside its top-level try/if/with blocks."""
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        yield node
        if isinstance(node, (ast.Try, ast.If, ast.With)):
            pending += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []) + [
                s for handler in getattr(node, "handlers", []) for s in handler.body]


def _module_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in _top_level(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def test_no_module_keeps_mutable_state():
    """State is what changes: a lock or client made at import, a `global` rebinding, or a module-level name
    mutated by a function. Constant tables (dicts never written) are not state."""
    found = []
    for name, path, tree in modules():
        where = path.relative_to(OPERATOR)
        module_names = _module_names(tree)
        for node in _top_level(tree):
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and _callee(value) not in IMMUTABLE_CALLS:
                found.append(f"{where}:{node.lineno} makes {ast.unparse(value.func)}(...) at import")
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            local = {a.arg for a in function.args.args + function.args.kwonlyargs}
            local |= {t.id for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AnnAssign))
                      for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
            shared = module_names - local
            for node in ast.walk(function):
                if isinstance(node, ast.Global):
                    found.append(f"{where}:{node.lineno} global {', '.join(node.names)}")
                elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                    for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                                and target.value.id in shared:
                            found.append(f"{where}:{node.lineno} writes into module-level {target.value.id}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and isinstance(node.func.value, ast.Name) and node.func.value.id in shared
                      and node.func.attr in MUTATORS):
                    found.append(f"{where}:{node.lineno} {node.func.value.id}.{node.func.attr}() changes module state")
    assert found == []
