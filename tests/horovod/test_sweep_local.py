"""`scalingrun sweep --local`: a short real sweep (1 then 2 Horovod processes, 1 epoch, tiny data) on this
machine: one dataset for both points, the table with speedup and efficiency, the note about cores, the PNG."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

pytestmark = pytest.mark.horovod


def test_local_sweep_one_then_two_processes(tmp_path):
    from scalingrun_operator.local.sample_data import fashion_mnist_jpegs

    source = tmp_path / "jpeg"
    for relative, data in fashion_mnist_jpegs(12):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(data)
    sweep = {
        "apiVersion": "scalingrun.dev/v1alpha1", "kind": "ScalingSweep", "metadata": {"name": "tiny"},
        "spec": {"workers": [1, 2], "template": {
            "dataset": {"source": str(source), "output": str(tmp_path / "parquet"), "imageSize": 32,
                        "preprocessing": {"parallelism": 1}},
            "model": {"base": "mobilenet_v2", "weights": "none"},
            "training": {"maxEpochs": 1, "batchSizePerWorker": 8},
            "workers": {"gpusPerWorker": 0}}},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    result = subprocess.run(
        [sys.executable, "-m", "scalingrun_operator.cli", "sweep", "--local", "-f", str(path),
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out, err = result.stdout, result.stderr

    # The second point reused the first point's dataset (laid out for 2 readers).
    assert "(same fingerprint: reused)" in err.split("== point tiny-w2")[1], err[-3000:]
    # The table: a header with speedup and efficiency, one row per point.
    lines = out.split("== ScalingSweep tiny ==")[1].strip().splitlines()
    header = lines[0].split()
    assert {"workers", "processes", "speedup", "efficiency", "worker-hours", "best_val_accuracy"} <= set(header)
    rows = [dict(zip(header, line.split())) for line in lines[1:3]]
    assert [(r["workers"], r["processes"], r["epochs"]) for r in rows] == [("1", "1", "1"), ("2", "2", "1")]
    assert rows[0]["speedup"] == "1.00" and rows[0]["efficiency"] == "1.00"
    speedup, efficiency = float(rows[1]["speedup"]), float(rows[1]["efficiency"])
    assert speedup > 0 and efficiency == pytest.approx(speedup / 2, abs=0.01)
    assert re.search(r"^recommended: \d workers? \(\d process(es)?\)", out, re.M), out
    # 2 CPU processes on the cores one process already uses: the output says why scaling is poor.
    assert "note: 2 CPU processes share this machine's" in out or "note: 2 processes on 1 CPU cores" in out
    report = re.search(r"^report: (\S+\.png) and (\S+\.md)$", out, re.M)
    with Image.open(report.group(1)) as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 1000
    page = Path(report.group(2)).read_text()
    assert "| workers | processes |" in page and "speedup" in page and "efficiency" in page
    statuses = [json.loads((tmp_path / "work" / f"tiny-w{n}" / "status.json").read_text()) for n in (1, 2)]
    assert [s["training"]["processes"] for s in statuses] == [1, 2]
    assert [s["training"]["learningRate"] for s in statuses] == [0.001, 0.002]  # linear scaling per point
