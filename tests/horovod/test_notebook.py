"""examples/notebooks/horovod-runner.ipynb run end to end by a real Jupyter kernel (nbclient starting ipykernel), as a
reader runs it: HorovodRunner(np=-2) trains its train_hvd on 2 Horovod processes, the epochs show as they come,
rank 0's value comes back, its metrics become a DataFrame and a plot is drawn."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import sys

import pytest
from PIL import Image

from tests.support.env import ROOT, require
from tests.support.horovodrun import horovodrun

pytestmark = pytest.mark.horovod

NOTEBOOK = ROOT / "examples/notebooks/horovod-runner.ipynb"
# Appended to the notebook here: what the kernel holds once the reader's cells have run.
STATE_CELL = """import json
print(json.dumps({"returned": {key: result[key] for key in ("rank", "size")}, "type": type(metrics).__name__,
                  "epochs": [int(epoch) for epoch in metrics.index], "columns": sorted(metrics.columns)}))"""


def test_the_example_notebook_trains_with_horovod_runner_in_a_jupyter_kernel(tmp_path, monkeypatch):
    horovodrun()
    require(all(importlib.util.find_spec(name) for name in ("nbclient", "ipykernel", "nbformat")),
            "nbclient, ipykernel or nbformat not installed (run scripts/setup.sh)")
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    readers = len(notebook.cells)
    notebook.cells.append(nbformat.v4.new_code_cell(STATE_CELL))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    # The kernel imports scalingrun as an installed package would be found: from this process's import path.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path for path in sys.path if path))
    # In a folder of its own, as a notebook opened there; a cell that raises fails here (CellExecutionError).
    NotebookClient(notebook, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(tmp_path)}}
                   ).execute()

    outputs = [output for cell in notebook.cells[:readers] if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    shown = "".join(output.text for output in outputs if output.output_type == "stream")
    # Rank 0's Keras lines, relayed as they came, then the cell's line about the value rank 0 returned.
    assert "Epoch 1/2" in shown and "Epoch 2/2" in shown, shown
    assert "rank 0 of 2 returned 2 epochs" in shown, shown
    state = json.loads(notebook.cells[-1].outputs[0].text)
    assert state == {"returned": {"rank": 0, "size": 2}, "type": "DataFrame", "epochs": [1, 2],
                     "columns": ["accuracy", "loss", "val_accuracy", "val_loss"]}
    tables = [output for output in outputs if "text/html" in output.get("data", {})]
    assert len(tables) == 1 and "val_accuracy" in tables[0].data["text/html"]  # the DataFrame as Jupyter shows it
    plots = [output.data["image/png"] for output in outputs if "image/png" in output.get("data", {})]
    assert len(plots) == 1
    with Image.open(io.BytesIO(base64.b64decode(plots[0]))) as image:
        image.verify()
        assert image.format == "PNG"
