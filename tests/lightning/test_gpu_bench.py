"""bench/gpu.py, the GPU check, in its CPU dry run (--dry-run): the same script end to end on small data, as the GPU
machine runs it (docs/benchmarks.md, "On a GPU"): every row of its table present, every figure positive."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.lightning

ROOT = Path(__file__).resolve().parents[2]
ROWS = [
    "data",
    "input pipeline: our reader (TrainBatches)",
    "input pipeline: bare pyarrow read",
    "training: 1 process, featureCache off",
    "training: 1 process, featureCache auto",
    "featureCache auto against off",
    "frozen rank: 2 ranks, rank 1 SIGSTOPped mid-epoch (gloo)",
]


def test_dry_run_prints_every_row_with_a_positive_figure(lightning_python, mpirun, tmp_path):
    result = subprocess.run([lightning_python, str(ROOT / "bench/gpu.py"), "--dry-run", "--frozen-timeout", "10",
                             "--frozen-limit", "30"], capture_output=True, text=True, timeout=900,
                            env={**{k: v for k, v in os.environ.items() if k != "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS"},
                                 "OUT": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("GPU check on"):].strip()
    assert (tmp_path / "gpu-bench.md").read_text().strip() == table
    assert table.startswith("GPU check on **CPU only (")  # the device named
    rows = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 5 and cells[0] not in ("measurement", "---"):
            rows[cells[0]] = cells
    assert list(rows) == ROWS, table
    for name, (_, device, _, figure, notes) in rows.items():
        number = re.match(r"^>? ?([\d,]+(?:\.\d+)?)", figure)
        assert number and float(number.group(1).replace(",", "")) > 0, (name, figure, notes)
    assert "features cached in" in rows["training: 1 process, featureCache auto"][4]
    assert "features cached" not in rows["training: 1 process, featureCache off"][4]
    # The frozen rank ends the launcher with a non-zero exit, or the bench stops it at its limit and says so.
    frozen = rows[ROWS[-1]]
    assert frozen[2] == "SCALINGRUN_COLLECTIVE_TIMEOUT_SECONDS=10"
    assert re.match(r"launcher exit [1-9]", frozen[4]) or (frozen[3] == "> 30 s" and "killed" in frozen[4]), frozen
    assert json.loads((tmp_path / "gpu-bench.json").read_text())["facts"]["cuda"] is False
