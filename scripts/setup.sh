#!/usr/bin/env bash
# Installs the whole pinned stack into .venv, idempotently:
#   Debian Open MPI + Fashion-MNIST, requirements/lock.txt (--no-deps: the lock is the full closure),
#   petastorm without its declared deps, Horovod 0.28.1 built from source with TF + Gloo + MPI
#   (the wheel is cached, so a second setup does not rebuild it), and this project in editable mode.
# A second run with unchanged inputs returns in about a second.
# Env: SCALINGRUN_VENV (default .venv), SCALINGRUN_CACHE (default ~/.cache/scalingrun), PYTHON (python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SCALINGRUN_VENV:-$ROOT/.venv}"
CACHE="${SCALINGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalingrun}"
PYTHON="${PYTHON:-python3}"
HOROVOD_VERSION=0.28.1
PETASTORM_VERSION=0.13.1
TF_VERSION="$(sed -n 's/^tensorflow-cpu==//p' "$ROOT/requirements/lock.txt")"
APT_PACKAGES=(openmpi-bin libopenmpi-dev dataset-fashion-mnist)

log() { printf '[setup] %s\n' "$*" >&2; }

install_system_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
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
  cat "$ROOT/requirements/lock.txt" "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16
}

horovod_wheel() {
  local dir="$CACHE/wheels/horovod-$HOROVOD_VERSION-tf$TF_VERSION-cpu-py$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
  if ! ls "$dir"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod $HOROVOD_VERSION against TF $TF_VERSION (about 7 minutes, once)"
    mkdir -p "$dir.tmp"
    # --no-build-isolation: cmake must see the installed TensorFlow.
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
      "$VENV/bin/pip" wheel -q --no-build-isolation --no-deps -w "$dir.tmp" "horovod==$HOROVOD_VERSION" >&2
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  ls "$dir"/horovod-*.whl
}

main() {
  install_system_packages
  local want; want="$(stack_fingerprint)"
  if [[ -f "$VENV/.scalingrun-stack" && "$(cat "$VENV/.scalingrun-stack")" == "$want" ]]; then
    log "stack up to date in $VENV"
    return 0
  fi
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "pip==25.3" "setuptools==80.9.0" "wheel==0.45.1"
  log "installing requirements/lock.txt"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$ROOT/requirements/lock.txt"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "petastorm==$PETASTORM_VERSION"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$(horovod_wheel)"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
  echo "$want" > "$VENV/.scalingrun-stack"
  log "stack ready in $VENV"
}

main "$@"
