#!/usr/bin/env bash
# Installs the whole pinned stack into .venv, idempotently:
#   Debian Open MPI + Fashion-MNIST, requirements/lock.txt (--no-deps: the lock is the full closure),
#   petastorm without its declared deps, Horovod 0.28.1 built from source with TF + Gloo + MPI
#   (the wheel is cached, so a second setup does not rebuild it), and this project in editable mode.
# Every download is checked against the hashes in requirements/ (pip --require-hashes; scripts/lock.sh writes
# them): the locks, pip/setuptools/wheel (bootstrap.txt), petastorm.txt, torch-cpu.txt, and for the GPU images
# tensorflow-gpu.txt, torch-cuda.txt and cuda-build.txt, and Horovod's source distribution (horovod.txt) before it
# is built. Not hashed: the Horovod wheel built here from
# that checked source (a local build has no published hash; its cache folder is named after the sdist's hash)
# and this project itself (the checkout).
# A second run with unchanged inputs returns in about a second.
# Env: SCALINGRUN_VENV (default .venv), SCALINGRUN_CACHE (default ~/.cache/scalingrun), PYTHON (python3),
#   SCALINGRUN_PROFILE: full (default: everything, for development and tests), operator or trainer
#     (the images: requirements/operator.txt or trainer.txt, subsets of lock.txt),
#     or lightning (the PyTorch Lightning trainer: requirements/lightning.txt, torch CPU, no TensorFlow or
#     Horovod, into SCALINGRUN_VENV default .venv-lightning; quickstart.sh and test.sh call it when needed),
#   SCALINGRUN_TORCH_INDEX (lightning): an extra index for torch, e.g. https://download.pytorch.org/whl/cpu
#     (images); a torch wheel in $SCALINGRUN_CACHE/wheels/torch is used first,
#   SCALINGRUN_TORCH_LOCK (lightning): the hashed torch pins (default requirements/torch-cpu.txt, with
#     SCALINGRUN_GPU=1 requirements/torch-cuda.txt: PyPI's CUDA build and the NVIDIA wheels it pins),
#   SCALINGRUN_GPU=1: the GPU images. Keras: TensorFlow's GPU wheel (same version) with its CUDA, cuDNN and NCCL
#     wheels (tensorflow-gpu.txt), and Horovod built with NCCL by the CUDA compiler of cuda-build.txt (PyPI
#     wheels, installed into the cache, not the venv); Lightning: torch-cuda.txt. No CUDA toolkit on the host.
#   SCALINGRUN_EDITABLE=0: install the project itself non-editable (images).
#   SCALINGRUN_EXTRA_SYSTEM_PACKAGES: more Debian packages for the same apt-get (scripts/test.sh: the builders');
#   SCALINGRUN_SYSTEM_PACKAGES_ONLY=1: install the Debian packages and stop; SCALINGRUN_SYSTEM_PACKAGES=0: install
#   none (the images, whose scripts/image-packages.sh installs them).
# The full profile also installs the MLflow tracking server the tests run, in its own venv
# (SCALINGRUN_MLFLOW_VENV, default .venv-mlflow) from requirements/mlflow-server.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${SCALINGRUN_PROFILE:-full}"
if [[ "$PROFILE" == lightning ]]; then VENV="${SCALINGRUN_VENV:-$ROOT/.venv-lightning}"; else VENV="${SCALINGRUN_VENV:-$ROOT/.venv}"; fi
CACHE="${SCALINGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalingrun}"
PYTHON="${PYTHON:-python3}"
REQ="$ROOT/requirements"
HOROVOD_VERSION="$(sed -n 's/^horovod==\([^ ]*\).*/\1/p' "$REQ/horovod.txt")"
HOROVOD_SDIST_HASH="$(sed -n 's/.*--hash=sha256:\([0-9a-f]*\).*/\1/p' "$REQ/horovod.txt")"
PIP=(--disable-pip-version-check --require-hashes)  # every install below checks the hashes of what it downloads
GPU="${SCALINGRUN_GPU:-0}"
# A wheelhouse of the locks' files (scripts/build-images.sh makes one on the host for the images): the locks are then
# installed from it alone, with no index, each file still checked against the lock's hash.
WHEELHOUSE="$CACHE/wheels/pip"
INDEX=()
[[ ! -d "$WHEELHOUSE" ]] || INDEX=(--no-index --find-links "$WHEELHOUSE")
TORCH_LOCK="${SCALINGRUN_TORCH_LOCK:-$REQ/torch-cpu.txt}"
[[ "$GPU" != 1 || -n "${SCALINGRUN_TORCH_LOCK:-}" ]] || TORCH_LOCK="$REQ/torch-cuda.txt"
TF_VERSION="$(sed -n 's/^tensorflow-cpu==\([^ ]*\).*/\1/p' "$REQ/lock.txt")"
case "$PROFILE" in
  full) LOCK="$ROOT/requirements/lock.txt"; APT_PACKAGES=(openmpi-bin libopenmpi-dev dataset-fashion-mnist prometheus) ;;
  trainer) LOCK="$ROOT/requirements/trainer.txt"; APT_PACKAGES=(openmpi-bin libopenmpi-dev) ;;
  operator) LOCK="$ROOT/requirements/operator.txt"; APT_PACKAGES=() ;;
  lightning) LOCK="$ROOT/requirements/lightning.txt"; APT_PACKAGES=(openmpi-bin libopenmpi-dev) ;;
  *) echo "SCALINGRUN_PROFILE must be full, operator, trainer or lightning" >&2; exit 2 ;;
esac

log() { printf '[setup] %s\n' "$*" >&2; }

install_system_packages() {
  [[ "${SCALINGRUN_SYSTEM_PACKAGES:-1}" != 0 ]] || return 0  # the images: scripts/image-packages.sh installs them
  local missing=() extra
  read -r -a extra <<< "${SCALINGRUN_EXTRA_SYSTEM_PACKAGES:-}"
  for p in "${APT_PACKAGES[@]:-}" "${extra[@]:-}"; do
    [[ -n "$p" ]] || continue
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  local sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Inputs whose change must trigger a reinstall; their hash is stamped into the venv.
stack_fingerprint() {
  { cat "$LOCK" "$REQ"/{bootstrap,petastorm,horovod,tensorflow-gpu,cuda-build}.txt "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}"
    [[ "$PROFILE" != lightning ]] || cat "$TORCH_LOCK"; echo "$PROFILE $GPU"; } | sha256sum | cut -c1-16
}

# The CUDA 13.0 compiler, headers and static runtime from PyPI wheels (cuda-build.txt), as a CUDA_HOME in the
# cache: its wheels share one tree (nvidia/cu13/{bin,include,lib,nvvm}); CMake's CUDA toolkit search wants lib64
# and the unversioned libcudart.so (the wheel has libcudart.so.13), though the kernels link the static one.
cuda_home() {
  local dir="$CACHE/cuda-build-$(sha256sum "$REQ/cuda-build.txt" | cut -c1-12)"
  if [[ ! -x "$dir/nvidia/cu13/bin/nvcc" ]]; then
    log "installing the CUDA compiler wheels (requirements/cuda-build.txt) into $dir"
    rm -rf "$dir" && "$VENV/bin/pip" install -q "${PIP[@]}" --no-deps --target "$dir" -r "$REQ/cuda-build.txt" >&2
    ln -s lib "$dir/nvidia/cu13/lib64" && ln -s libcudart.so.13 "$dir/nvidia/cu13/lib/libcudart.so"
  fi
  echo "$dir/nvidia/cu13"
}

horovod_wheel() {
  local flavour=cpu gpu_ops=()
  if [[ "$GPU" == 1 ]]; then
    # NCCL is TensorFlow's (tensorflow-gpu.txt): headers and library from its wheel, linked shared and found at run
    # time through the rpath (the wheel has libnccl.so.2 only; the link wants libnccl.so). The CUDA kernels link the
    # CUDA runtime statically: the image keeps TensorFlow's CUDA 12.2 libraries only.
    local cuda nccl site
    cuda="$(cuda_home)"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    nccl="$CACHE/nccl-link" && mkdir -p "$nccl" && ln -sf "$site/nvidia/nccl/lib/libnccl.so.2" "$nccl/libnccl.so"
    flavour=gpu
    gpu_ops=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$cuda" CUDA_HOME="$cuda" PATH="$cuda/bin:$PATH"
      HOROVOD_NCCL_INCLUDE="$site/nvidia/nccl/include" HOROVOD_NCCL_LIB="$nccl" HOROVOD_NCCL_LINK=SHARED
      LDFLAGS="-Wl,-rpath,$site/nvidia/nccl/lib")
  fi
  local dir="$CACHE/wheels/horovod-$HOROVOD_VERSION-${HOROVOD_SDIST_HASH:0:12}-tf$TF_VERSION-$flavour-py$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
  if ! ls "$dir"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod $HOROVOD_VERSION against TF $TF_VERSION (about 7 minutes, once)"
    mkdir -p "$dir.tmp"
    # --no-build-isolation: cmake must see the installed TensorFlow. The sdist is checked against its hash.
    env "${gpu_ops[@]}" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
      "$VENV/bin/pip" wheel -q "${PIP[@]}" --no-binary horovod --no-build-isolation --no-deps -w "$dir.tmp" \
      -r "$REQ/horovod.txt" >&2
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  ls "$dir"/horovod-*.whl
}

# A separate venv: the server's closure (Flask, SQLAlchemy, scikit-learn...) never meets the training stack.
install_mlflow_server() {
  local venv="${SCALINGRUN_MLFLOW_VENV:-$ROOT/.venv-mlflow}" lock="$ROOT/requirements/mlflow-server.txt" want
  want="$(sha256sum "$lock" | cut -c1-16)"
  [[ -f "$venv/.scalingrun-stack" && "$(cat "$venv/.scalingrun-stack")" == "$want" ]] && return 0
  log "installing the MLflow tracking server for the tests into ${venv#"$ROOT/"}"
  [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q "${PIP[@]}" -r "$REQ/bootstrap.txt"
  "$venv/bin/pip" install -q "${PIP[@]}" --no-deps -r "$lock"
  echo "$want" > "$venv/.scalingrun-stack"
}

main() {
  install_system_packages
  [[ "${SCALINGRUN_SYSTEM_PACKAGES_ONLY:-0}" != 1 ]] || return 0
  [[ "$PROFILE" != full ]] || install_mlflow_server
  local want; want="$(stack_fingerprint)"
  if [[ -f "$VENV/.scalingrun-stack" && "$(cat "$VENV/.scalingrun-stack")" == "$want" ]]; then
    log "stack up to date in $VENV"
    return 0
  fi
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q "${PIP[@]}" "${INDEX[@]}" -r "$REQ/bootstrap.txt"
  log "installing ${LOCK#"$ROOT/"}"
  local sources=()
  if [[ "$PROFILE" == lightning ]]; then
    [[ ! -d "$CACHE/wheels/torch" ]] || sources+=(--find-links "$CACHE/wheels/torch")
    [[ -z "${SCALINGRUN_TORCH_INDEX:-}" ]] || sources+=(--extra-index-url "$SCALINGRUN_TORCH_INDEX")
  fi
  "$VENV/bin/pip" install -q "${PIP[@]}" "${INDEX[@]}" --no-deps -r "$LOCK"
  if [[ "$PROFILE" == lightning ]]; then
    # torch-cpu.txt is the CPU build; a GPU image names the CUDA build of the same version (SCALINGRUN_TORCH_LOCK)
    # from PyTorch's index (README, "PyTorch Lightning"). No Horovod: DDP runs over gloo/nccl.
    "$VENV/bin/pip" install -q "${PIP[@]}" --no-deps "${sources[@]}" -r "$TORCH_LOCK"
    "$VENV/bin/pip" install -q "${PIP[@]}" "${INDEX[@]}" --no-deps -r "$REQ/petastorm.txt"
  elif [[ "$PROFILE" != operator ]]; then
    if [[ "$GPU" == 1 ]]; then
      # Same version and dependencies as tensorflow-cpu; the GPU wheel uses the image's CUDA 12.2 / cuDNN 8.9.
      "$VENV/bin/pip" uninstall -q -y tensorflow-cpu
      "$VENV/bin/pip" install -q "${PIP[@]}" --no-deps -r "$REQ/tensorflow-gpu.txt"
    fi
    "$VENV/bin/pip" install -q "${PIP[@]}" "${INDEX[@]}" --no-deps -r "$REQ/petastorm.txt"
    # Built here from the hash-checked sdist: a local wheel has no published hash to check against.
    "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$(horovod_wheel)"
  fi
  # This project itself: the checkout, not a download.
  local editable=(-e); [[ "${SCALINGRUN_EDITABLE:-1}" == 1 ]] || editable=()
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation "${editable[@]}" "$ROOT"
  echo "$want" > "$VENV/.scalingrun-stack"
  log "stack ready in $VENV"
}

main "$@"
