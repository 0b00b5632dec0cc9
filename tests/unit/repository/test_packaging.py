"""Import boundaries: the operator never needs TensorFlow, the trainer never needs kopf, and the API package
they share needs neither."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

IMPORT_ALL = """
import importlib, pkgutil, sys
for blocked in {blocked!r}:
    sys.modules[blocked] = None  # any import of it raises ImportError
package = importlib.import_module({package!r})
for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not module.name.startswith(tuple({skip!r})):
        importlib.import_module(module.name)
print("ok")
"""
# The PyTorch Lightning trainer lives in its own venv (torch, no TensorFlow): imported there, below.
LIGHTNING = "scalingrun_trainer.frameworks.lightning"
LIGHTNING_PARTS = [LIGHTNING, "scalingrun_trainer.engines.lightning_ddp", "scalingrun_trainer.sdk.lightning"]
LIGHTNING_PYTHON = Path(__file__).resolve().parents[3] / ".venv-lightning/bin/python"


@pytest.mark.parametrize(
    "package,blocked",
    [
        ("scalingrun_operator", ["tensorflow", "horovod", "petastorm", "pyarrow", "mpi4py"]),
        ("scalingrun_trainer", ["kopf", "kubernetes"]),
        # The Python client runs in a notebook: the kubernetes client, no kopf, no framework (the ranks import those).
        ("scalingrun", ["kopf", "tensorflow", "horovod", "torch", "petastorm", "mpi4py"]),
        ("scalingrun_api", ["kopf", "kubernetes", "tensorflow", "horovod", "torch", "petastorm", "pyarrow"]),
        # The trainer's core is framework-free; the Keras layer and the multi-worker-mirrored engine need no Horovod.
        ("scalingrun_trainer.core", ["tensorflow", "keras", "horovod", "torch", "pytorch_lightning", "kopf"]),
        ("scalingrun_trainer.frameworks.keras", ["horovod", "torch", "kopf", "kubernetes"]),
        ("scalingrun_trainer.engines.keras_mirrored", ["horovod", "torch", "kopf", "kubernetes"]),
    ],
)
def test_package_imports_without_the_other_side(package, blocked):
    code = IMPORT_ALL.format(package=package, blocked=blocked, skip=LIGHTNING_PARTS)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.lightning
def test_lightning_trainer_imports_without_tensorflow_horovod_or_kopf():
    from tests.support.env import require

    require(LIGHTNING_PYTHON.exists(), f"no {LIGHTNING_PYTHON}: SCALINGRUN_PROFILE=lightning scripts/setup.sh")
    code = IMPORT_ALL.format(package=LIGHTNING, blocked=["tensorflow", "horovod", "keras", "kopf", "kubernetes"],
                             skip=["-"])
    code += ("import scalingrun_trainer.cli, scalingrun_trainer.engines.keras_horovod.train, "
             "scalingrun_trainer.engines.lightning_ddp.train, scalingrun_trainer.sdk.lightning\n")
    result = subprocess.run([str(LIGHTNING_PYTHON), "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_stdlib_operator_is_not_shadowed():
    """Run from the repository root, where a folder named operator/ sits on sys.path[0]."""
    code = "import operator, sysconfig; print(operator.__file__); print(sysconfig.get_paths()['stdlib'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 0, result.stderr
    module_file, stdlib = result.stdout.split()
    assert module_file.startswith(stdlib)


def test_no_script_folder_shadows_a_standard_library_module():
    """A script run as `python bench/x.py` has its own folder first on sys.path: a bench/operator.py there was
    imported as the standard library's `operator` before any import of the script's own could run."""
    root = Path(__file__).resolve().parents[3]
    shadows = [str(path.relative_to(root)) for folder in ("bench", "scripts") for path in (root / folder).glob("*.py")
               if path.stem in sys.stdlib_module_names]
    assert shadows == []
