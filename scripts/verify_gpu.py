"""A GPU trainer image checks itself on a host without a GPU (scripts/verify-image.sh IMAGE gpu|lightning-gpu --gpu).

Run by the image's own Python. Each check prints one line; the exit status is 1 when any fails.
  libraries  the CUDA runtime, cuDNN and NCCL of the image's NVIDIA wheels load (ctypes, by absolute path: what the
             framework would dlopen, and their own dependencies resolve), and no CUDA driver is there to hide behind
  framework  Keras: TensorFlow reports a CUDA build with the wheels' CUDA and cuDNN versions, and Horovod was built
             with NCCL (hvd.nccl_built()); Lightning: torch.version.cuda is set and torch.cuda.is_available() is
             False without a driver (no exception)
  no driver  a real ScalingRun asking for a GPU, run by `scalingrun run --local` on a small Parquet table, ends
             Succeeded on the CPU with the GPUsUnused condition saying why, and no traceback in its log

Usage (in the image): python verify_gpu.py keras|lightning WORKDIR
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

NVIDIA = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
# The libraries each flavour's framework loads, by soname: TensorFlow 2.15's CUDA 12 set, torch 2.13's CUDA 13 set.
LIBRARIES = {
    "keras": {"CUDA runtime": "libcudart.so.12", "cuDNN": "libcudnn.so.8", "cuBLAS": "libcublas.so.12",
              "NCCL": "libnccl.so.2"},
    "lightning": {"CUDA runtime": "libcudart.so.13", "cuDNN": "libcudnn.so.9", "cuBLAS": "libcublas.so.13",
                  "NCCL": "libnccl.so.2"},
}
RUN = """apiVersion: scalingrun.dev/v1alpha1
kind: ScalingRun
metadata:
  name: gpu-image-check
spec:
  dataset:
    source: {table}
    output: {output}
    format: parquet
    columns: {{image: pixels, label: label}}
    imageSize: 32
  model: {{base: efficientnet_lite0, weights: none}}
  training:
    framework: {framework}
    batchSizePerWorker: 8
    maxEpochs: 1
  workers:
    replicas: 1
    gpusPerWorker: 1
"""

failures: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def libraries(flavour: str) -> None:
    for name, soname in LIBRARIES[flavour].items():
        found = sorted(NVIDIA.glob(f"*/lib/{soname}"))  # nvidia/<package>/lib, as the wheels lay them out
        if not found:
            check(f"{name} loads", False, f"no {soname} under {NVIDIA}/*/lib")
            continue
        try:
            ctypes.CDLL(str(found[0]))
            check(f"{name} loads", True, str(found[0]))
        except OSError as error:
            check(f"{name} loads", False, str(error))
    try:
        ctypes.CDLL("libcuda.so.1")
        check("no CUDA driver", False, "libcuda.so.1 loads: this check is for a host without a GPU")
    except OSError:
        check("no CUDA driver", True, "libcuda.so.1 is absent, as on a CPU-only host")


def keras() -> None:
    import tensorflow as tf

    info = tf.sysconfig.get_build_info()
    cuda, cudnn = info.get("cuda_version"), info.get("cudnn_version")
    check("TensorFlow is a CUDA build", tf.test.is_built_with_cuda() and bool(cuda) and bool(cudnn),
          f"tensorflow {tf.__version__}, CUDA {cuda}, cuDNN {cudnn}")
    runtime = NVIDIA / "cuda_runtime/lib/libcudart.so.12"
    check("TensorFlow's CUDA is the wheels'", str(cuda).startswith("12") and runtime.exists(),
          f"built for CUDA {cuda}, wheel {runtime.name}")
    check("no GPU visible without a driver", tf.config.list_physical_devices("GPU") == [],
          str(tf.config.list_physical_devices("GPU")))
    import horovod.tensorflow as hvd

    check("Horovod built with NCCL", bool(hvd.nccl_built()), f"hvd.nccl_built() = {hvd.nccl_built()}, "
          f"cuda_built() = {hvd.cuda_built()}, mpi_built() = {hvd.mpi_built()}, gloo_built() = {hvd.gloo_built()}")


def lightning() -> None:
    import torch

    check("torch is a CUDA build", bool(torch.version.cuda), f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    check("cuDNN and NCCL in torch", torch.backends.cudnn.is_available() and torch.cuda.nccl.version() is not None,
          f"cuDNN {torch.backends.cudnn.version()}, NCCL {torch.cuda.nccl.version()}")
    check("no GPU visible without a driver", torch.cuda.is_available() is False,
          f"torch.cuda.is_available() = {torch.cuda.is_available()}")


def write_table(root: Path, side: int = 32, rows: int = 48) -> None:
    """Random 32x32 RGB images in 3 classes, in row groups enough for the readers."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    for split, count in (("train", rows), ("validation", rows // 2)):
        (root / split).mkdir(parents=True, exist_ok=True)
        pixels = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8).tobytes() for _ in range(count)]
        table = pa.table({"pixels": pa.array(pixels, pa.binary()), "label": pa.array([i % 3 for i in range(count)])})
        pq.write_table(table, root / split / "part-0.parquet", row_group_size=8)


def run_without_driver(flavour: str, workdir: Path) -> None:
    write_table(workdir / "table")
    spec = workdir / "run.yaml"
    spec.write_text(RUN.format(table=workdir / "table", output=workdir / "output",
                               framework="pytorch-lightning" if flavour == "lightning" else "keras"))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if flavour == "lightning":
        env["SCALINGRUN_LIGHTNING_PYTHON"] = sys.executable  # the image's one venv is the Lightning one
    result = subprocess.run(["scalingrun", "run", "--local", "-f", str(spec), "--workdir", str(workdir / "run")],
                            capture_output=True, text=True, env=env, timeout=1200)
    log = result.stdout + result.stderr
    logs = log + "".join(Path(p).read_text(errors="replace") for p in glob.glob(f"{workdir}/run/**/*.log",
                                                                                    recursive=True))
    status_files = glob.glob(f"{workdir}/run/**/status.json", recursive=True)
    status = json.loads(Path(status_files[0]).read_text()) if status_files else {}
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    unused = conditions.get("GPUsUnused", {})
    check("a GPU run without a driver ends Succeeded", result.returncode == 0 and status.get("phase") == "Succeeded",
          f"exit {result.returncode}, phase {status.get('phase')}" + ("" if result.returncode == 0 else "\n" + log[-3000:]))
    check("GPUsUnused says why", unused.get("status") == "True" and unused.get("reason") == "NoGPUVisible",
          f"{unused.get('reason')}: {unused.get('message')}")
    check("no traceback", "Traceback" not in logs, "the run's output and logs have none" if "Traceback" not in logs
          else logs[logs.index("Traceback"):][:2000])


def main() -> int:
    flavour, workdir = sys.argv[1], Path(sys.argv[2])
    libraries(flavour)
    keras() if flavour == "keras" else lightning()
    run_without_driver(flavour, workdir)
    print("GPU image checks passed" if not failures else f"GPU image checks FAILED: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
