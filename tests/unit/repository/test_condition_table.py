"""docs/status-and-root-causes.md's table of conditions holds every condition type and reason the operator writes.

The operator's code is read (not run): every `.condition(TYPE, status, REASON, ...)` and `.fail(REASON, ...)` with
the names resolved to the module constants they stand for. A reason computed at run time is resolved by the rule
listed for its call site below; a new computed reason with no rule fails here, asking for one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from scalingrun_api.models import Phase, SweepPhase

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "operator" / "scalingrun_operator"
DOC = ROOT / "docs" / "status-and-root-causes.md"


def _constants() -> dict[str, str]:
    """Module-level NAME = "text" in the operator."""
    found: dict[str, str] = {}
    for path in OPERATOR.rglob("*.py"):
        found.update(_module_constants(path))
    return found


def _module_constants(path: Path) -> dict[str, str]:
    return {node.targets[0].id: node.value.value for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def _storage_reasons() -> set[str]:
    reasons = set()
    for path in OPERATOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (isinstance(item, ast.Assign) and [getattr(t, "id", "") for t in item.targets] == ["reason"]
                            and isinstance(item.value, ast.Constant)):
                        reasons.add(item.value.value)
    return reasons


def _pod_reasons() -> set[str]:
    """The pod problems decide/pods.py names (its CamelCase constants)."""
    return {value for value in _module_constants(OPERATOR / "decide" / "pods.py").values()
            if re.fullmatch(r"[A-Z][A-Za-z]+", value)}


# Reasons computed at run time, by (file, condition type, the reason's expression): what they can be.
def _computed() -> dict[tuple[str, str, str], set[str]]:
    pods, storage = _pod_reasons(), _storage_reasons()
    run_phases = {p.value for p in Phase}
    sweep_phases = {p.value for p in SweepPhase}
    return {
        ("interruptions.py", "ChildDeleted", "f'{kind}Deleted'"): {"JobDeleted", "MPIJobDeleted"},
        ("training.py", "Failed", "reason"): {"MPIJobFailed", "ModelBuilderFailed"},
        ("training.py", "Trained", "reason"): {"MPIJobFailed", "ModelBuilderFailed"},
        ("training.py", "Trained", "holdup[0] if holdup else 'Running'"): pods | {"Running"},
        ("preprocessing.py", "Preprocessed", "holdup[0] if holdup else 'Running'"): pods | {"Running"},
        ("training.py", "Queued", "reason"): {"WaitingForAdmission", "Preempted"},
        ("pods.py", "PodsHealthy", "problem.reason"): pods,
        ("faults.py", "NodeLost", "reason"): {"NodeNotReady", "TerminatingPastGrace"},
        ("draft.py", "StorageReadable", "found.reason"): storage,
        ("status.py", "Ready", "phase"): run_phases | sweep_phases,  # StatusUpdate over RUN_PHASES or SWEEP_PHASES
        ("status.py", "Stalled", "phase"): {Phase.failed.value},
        ("status.py", "Failed", "reason"): set(),  # StatusUpdate.fail: its callers are read instead
        ("training.py", "InputBound", "*"): {"InputWaitHigh", "InputKeepsUp"},
        ("training.py", "GPUsUnused", "*"): {"NoGPUVisible", "GPUsInUse"},
        ("elastic.py", "WorkersPlaced", "reason"): {"AllPlaced", "WaitingToShrink", "BelowMinReplicas", "Resizing",
                                                    "Shrunk", "GrowingAtEpoch", "CapacityProbesOff"},
    }


def written_conditions() -> dict[str, set[str]]:
    constants, computed, unresolved = _constants(), _computed(), []
    out: dict[str, set[str]] = {}

    def value(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, (ast.Name, ast.Attribute)):
            return constants.get(node.id if isinstance(node, ast.Name) else node.attr)
        return None

    for path in sorted(OPERATOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr == "condition" and node.args:
                type_ = value(node.args[0])
                reason_node = node.args[2] if len(node.args) >= 3 else None
            elif node.func.attr == "fail" and node.args and path.name != "status.py":
                type_, reason_node = "Failed", node.args[0]
            else:
                continue
            if type_ is None:
                continue
            reason = value(reason_node) if reason_node is not None else None
            if reason is not None:
                out.setdefault(type_, set()).add(reason)
                continue
            key = (path.name, type_, ast.unparse(reason_node) if reason_node is not None else "*")
            if key in computed:
                out.setdefault(type_, set()).update(computed[key])
            else:
                unresolved.append(key)
    assert not unresolved, f"reasons computed at run time with no rule in {__file__}: {unresolved}"
    return out


def documented_conditions() -> dict[str, set[str]]:
    """| `Type` | `Reason`, `Reason` | ... | rows of the doc's condition table."""
    text = DOC.read_text()
    table = text.split("## Every condition", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            out.setdefault(cells[0].strip("`"), set()).update(re.findall(r"`([A-Za-z]+)`", cells[1]))
    return out


def test_every_condition_and_reason_the_operator_writes_is_in_the_docs_table():
    written, documented = written_conditions(), documented_conditions()
    missing = {t: sorted(r - documented.get(t, set())) for t, r in written.items() if r - documented.get(t, set())}
    assert not missing, f"add these to the table under '## Every condition' in {DOC.name}: {missing}"


def test_the_docs_table_names_nothing_the_operator_does_not_write():
    written, documented = written_conditions(), documented_conditions()
    extra = {t: sorted(r - written.get(t, set())) for t, r in documented.items() if r - written.get(t, set())}
    assert not extra, f"the table in {DOC.name} names reasons nothing writes: {extra}"


def test_the_reading_of_the_code_finds_what_it_should():
    """The scan itself: a few pairs that are certainly written, from constants, literals and computed reasons."""
    written = written_conditions()
    assert {"BackoffLimitExceeded", "InvalidSpec", "PointFailed"} <= written["Failed"]
    assert {"ImagePullFailed", "OOMKilled", "PodsRunning", "Finished"} <= written["PodsHealthy"]
    assert {"Succeeded", "Failed", "Training"} <= written["Ready"]
