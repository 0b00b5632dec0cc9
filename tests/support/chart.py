"""The chart rendered by a real helm (the helm fixture finds it or skips, CI excepted)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.env import require


ROOT = Path(__file__).resolve().parents[2]


CHART = ROOT / "charts/scalingrun"


@pytest.fixture(scope="session")
def helm() -> str:
    result = subprocess.run(["bash", str(ROOT / "scripts/tools.sh")], capture_output=True, text=True)
    require(result.returncode == 0, f"helm not available: {result.stderr[-500:]}")
    return str(Path(result.stdout.strip()) / "helm")


def render(helm: str, values: Path | None = None, *extra: str, release: str = "t",
           namespace: str = "scalingrun-system") -> list[dict]:
    args = [helm, "template", release, str(CHART), "--namespace", namespace, *extra]
    if values:
        args += ["-f", str(values)]
    result = subprocess.run(args, capture_output=True, text=True, check=True)
    return [d for d in yaml.safe_load_all(result.stdout) if d]
