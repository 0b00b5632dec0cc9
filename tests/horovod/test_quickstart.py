"""A reduced quick start, end to end: SeaweedFS, JPEG upload, preprocessing, horovodrun -np 2, report; and the same
quick start with strategy multi-worker-mirrored (mpirun -np 2, no Horovod), which must reach the same accuracy."""

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
from tests.support.quickstart import LEARNS

pytestmark = [pytest.mark.horovod, pytest.mark.s3]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"horovod": "quickstart.yaml", "multi-worker-mirrored": "quickstart-mirrored.yaml"}


def reduced_spec(strategy: str) -> dict:
    spec = yaml.safe_load((ROOT / "examples" / EXAMPLES[strategy]).read_text())
    assert spec["spec"]["model"] == {"base": "efficientnet_lite0", "weights": "imagenet", "dropout": 0.2}
    spec["spec"]["dataset"]["imageSize"] = 96
    spec["spec"]["training"]["maxEpochs"] = 2
    spec["spec"]["training"]["batchSizePerWorker"] = 16
    return spec


class Quickstart:
    """One reduced quick start's state folder and command; `first` is its first run."""

    def __init__(self, folder: Path, strategy: str):
        spec = reduced_spec(strategy)
        self.name = spec["metadata"]["name"]
        run_file = self.run_file = folder / f"{self.name}-small.yaml"
        run_file.write_text(yaml.safe_dump(spec))
        self.state = folder / "state"
        self.command = [sys.executable, "-m", "scalingrun_operator.local.quickstart", "-f", str(run_file),
                        "--state", str(self.state), "--per-class", "20"]
        self.env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
        self.first = self.run()

    def run(self) -> subprocess.CompletedProcess:
        return subprocess.run(self.command, capture_output=True, text=True, timeout=600, env=self.env)

    def status(self) -> dict:
        return json.loads((self.state / f"runs/{self.name}/status.json").read_text())


@pytest.fixture(scope="module")
def quickstarts(tmp_path_factory):
    """Each strategy's reduced quick start, run once for the module (the comparison reuses them)."""
    runs: dict[str, Quickstart] = {}

    def of(strategy: str) -> Quickstart:
        if strategy not in runs:
            runs[strategy] = Quickstart(tmp_path_factory.mktemp(f"quickstart-{strategy}"), strategy)
        return runs[strategy]

    return of


def test_the_mirrored_quickstart_differs_from_horovods_in_the_strategy_only():
    horovod, mirrored = (yaml.safe_load((ROOT / "examples" / EXAMPLES[s]).read_text()) for s in EXAMPLES)
    assert mirrored["spec"]["training"].pop("strategy") == "multi-worker-mirrored"
    assert mirrored["spec"] == horovod["spec"]


@pytest.mark.parametrize("strategy", list(EXAMPLES))
def test_reduced_quickstart_end_to_end_and_rerun(quickstarts, strategy):
    quickstart = quickstarts(strategy)
    first = quickstart.first
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    assert "phase: Succeeded" in out
    assert re.search(r"preprocessing: 200 images written, 0 skipped, 10 classes", out), out
    training = re.search(r"training: (\d) of 2 epochs, best epoch (\d), val_accuracy ([\d.]+), 2 processes", out)
    assert training, out
    assert 1 <= int(training.group(2)) <= int(training.group(1)) and float(training.group(3)) >= LEARNS, out
    reports = quickstart.state / "reports"
    with Image.open(reports / f"{quickstart.name}-report.png") as image:
        image.verify()
        assert image.format == "PNG" and image.size[0] > 600
    assert "| 1 |" in (reports / f"{quickstart.name}-report.md").read_text()
    # What it made outlives its store: the model and the progress document, named by local paths.
    kept = quickstart.state / "runs" / quickstart.name
    assert f"model: {kept / 'model' / 'model.keras'} (copied from s3://" in out, out
    assert f"progress document: {kept / 'progress.json'}" in out, out
    assert (kept / "model" / "model.keras").stat().st_size > 100_000
    report = subprocess.run([sys.executable, "-m", "scalingrun_operator.cli", "report", "-f", str(quickstart.run_file),
                             "--workdir", str(kept), "-o", str(quickstart.state / "later")],
                            capture_output=True, text=True, timeout=120, env=quickstart.env)
    assert report.returncode == 0 and "which the local run kept" in report.stderr, report.stderr[-3000:]
    assert "| 1 |" in (quickstart.state / "later" / f"{quickstart.name}-report.md").read_text()
    status = quickstart.status()
    assert status["phase"] == "Succeeded" and status["training"]["processes"] == 2
    assert status["modelUri"].endswith(f"/runs/{quickstart.name}/model/model.keras")
    # The input-wait share of every epoch, and InputBound decided from it as the operator does.
    history = status["training"]["inputHistory"]
    assert [e["epoch"] for e in history] == list(range(1, int(training.group(1)) + 1))
    assert all(0 <= e["inputWaitFraction"] <= 1 for e in history)
    assert [c["status"] for c in status["conditions"] if c["type"] == "InputBound"] in (["True"], ["False"])

    second = quickstart.run()
    assert second.returncode == 0, second.stderr[-3000:]
    assert "already Fashion-MNIST JPEGs" in second.stderr
    assert "(dataset reused)" in second.stdout and "nothing to train" in second.stdout
    assert "phase: Succeeded" in second.stdout
    # The rerun trained nothing; its status still tells how the run ended: rank 0 pushed the document it ended with.
    again = quickstart.status()
    assert (again["training"]["epoch"], again["modelUri"]) == (status["training"]["epoch"], status["modelUri"])
    # the processes it started are gone (SeaweedFS included)
    assert str(quickstart.state) not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_the_mirrored_quickstart_reaches_horovods_val_accuracy(quickstarts):
    """Same data, seed, image size, epochs, batch and learning rate: the two engines' best val_accuracy agree to
    0.02 (both reduce the gradients of 2 x 16 rows per step to their mean)."""
    best, scaled = {}, set()
    for strategy in EXAMPLES:
        quickstart = quickstarts(strategy)
        assert quickstart.first.returncode == 0, quickstart.first.stderr[-3000:]
        training = quickstart.status()["training"]
        scaled.add((training["effectiveBatchSize"], training["learningRate"]))
        best[strategy] = training["bestMetrics"]["val_accuracy"]
    assert len(scaled) == 1 and next(iter(scaled))[0] == 32, scaled
    print(f"best val_accuracy: horovod {best['horovod']:.4f}, multi-worker-mirrored "
          f"{best['multi-worker-mirrored']:.4f}")
    assert abs(best["multi-worker-mirrored"] - best["horovod"]) <= 0.02, best


def test_the_full_quickstart_gives_the_readmes_figures(tmp_path):
    """examples/quickstart.yaml as scripts/quickstart.sh runs it (10,000 images, seeded): the best epoch, its
    val_accuracy to four decimals and the epochs trained are the README's (docs/benchmarks.md#fig-quickstart). The
    README printed 0.8583 while two machines new to the project gave 0.8613: this holds them together."""
    readme = (ROOT / "README.md").read_text()
    printed = re.search(r"training: (\d+) of 10 epochs, best epoch (\d+), val_accuracy (0\.\d{4}), 2 processes", readme)
    assert printed, "the README's sample summary has no training line"
    result = subprocess.run([sys.executable, "-m", "scalingrun_operator.local.quickstart", "-f",
                             str(ROOT / "examples/quickstart.yaml"), "--state", str(tmp_path / "state")],
                            capture_output=True, text=True, timeout=900,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    training = json.loads((tmp_path / "state/runs/quickstart/status.json").read_text())["training"]
    seen = (training["epoch"], training["bestEpoch"], f"{training['bestMetrics']['val_accuracy']:.4f}")
    assert seen == (int(printed.group(1)), int(printed.group(2)), printed.group(3)), (seen, printed.groups())
