"""The trainer's structure, checked on its source like the operator's (test_structure.py): imports point down only,
siblings never import each other, no import cycle, no file longer than 400 lines, and never the operator.

The layers, bottom first (docs/architecture.md draws them): storage; core (framework-free: the training order, the
dataset's rules, progress, checkpoints, early stopping); the frameworks, preprocessing and the launcher, siblings;
the engines and the SDK, siblings; the command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from tests.support.import_graph import cycles, imports, module_graph, modules

TRAINER = Path(__file__).resolve().parents[3] / "trainer"
PACKAGE = "scalingrun_trainer"
# Each inner tuple is a layer; each name in it a group that imports only its own modules and the layers below.
LAYERS = [
    ("scalingrun_trainer.storage",),
    ("scalingrun_trainer.core",),
    ("scalingrun_trainer.frameworks.keras", "scalingrun_trainer.frameworks.lightning", "scalingrun_trainer.preprocess",
     "scalingrun_trainer.launch", "scalingrun_trainer.frameworks"),
    ("scalingrun_trainer.engines.keras_horovod", "scalingrun_trainer.engines.keras_mirrored",
     "scalingrun_trainer.engines.lightning_ddp", "scalingrun_trainer.sdk", "scalingrun_trainer.engines"),
    ("scalingrun_trainer.cli",),
]
NEVER = ("scalingrun_operator", "kopf", "kubernetes")  # the trainer image has neither the operator nor its stack
MAX_LINES = 400


def layer(module: str) -> Optional[tuple[int, str]]:
    """(layer, group) of a module: the longest prefix that names it."""
    best = None
    for index, groups in enumerate(LAYERS):
        for group in groups:
            if (module == group or module.startswith(group + ".")) and (best is None or len(group) > len(best[1])):
                best = (index, group)
    return best


def test_every_module_has_a_layer():
    missing = [name for name, _, _ in modules(TRAINER, PACKAGE) if name != PACKAGE and layer(name) is None]
    assert missing == [], f"modules in no layer of {__name__}.LAYERS: {missing}"


def test_imports_point_down_only():
    wrong = []
    for name, path, tree in modules(TRAINER, PACKAGE):
        here = layer(name)
        if here is None:
            continue
        for line, target in imports(name, path, tree):
            where = f"{path.relative_to(TRAINER)}:{line} {name}"
            if target.split(".")[0] in NEVER:
                wrong.append(f"{where} imports {target}")
                continue
            there = layer(target) if target.startswith(PACKAGE + ".") else None
            if there is None:  # another package, or `from .x import name` whose name is not a module
                continue
            if there[0] > here[0]:
                wrong.append(f"{where} (layer {here[0]}) imports {target} (layer {there[0]})")
            elif there[0] == here[0] and there[1] != here[1]:
                wrong.append(f"{where} imports its sibling {target}")
    assert wrong == []


def test_no_import_cycles():
    """Imports inside functions and under TYPE_CHECKING count: a cycle is one however late it closes."""
    assert cycles(module_graph(TRAINER, PACKAGE)) == []


def test_no_file_is_longer_than_400_lines():
    long = {str(path.relative_to(TRAINER)): n for _, path, _ in modules(TRAINER, PACKAGE)
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
