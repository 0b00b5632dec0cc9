#!/bin/sh
# The system packages of Dockerfile.trainer's two stages, on a Debian bookworm or Ubuntu 22.04 base:
#   image-packages.sh build     what compiling Horovod needs (builder stage only: compilers, MPI headers); with a
#                               Horovod wheel already in /tmp/scalingrun-cache/wheels only binutils (to strip it),
#                               and for SCALINGRUN_FRAMEWORK=pytorch-lightning (no Horovod) nothing
#   image-packages.sh runtime   Open MPI, the ssh server and client, CA certificates (the final image)
# Python 3.11 comes from the base image when it has one (python:3.11-*, Debian bookworm's python3), else
# from the deadsnakes PPA (Ubuntu 22.04, the CUDA images). Removes the host keys that openssh-server's
# install generates: every pod makes its own at start (scripts/trainer-entrypoint.sh).
set -eu
mode="${1:-}"
case "$mode" in
  build) packages="openmpi-bin libopenmpi-dev openssh-client g++ make cmake" ;;
  runtime) packages="openmpi-bin openssh-server openssh-client ca-certificates" ;;
  *) echo "usage: $0 build|runtime" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
. /etc/os-release
compiles=no  # whether this stage compiles Horovod
if [ "$mode" = build ]; then
  if [ "${SCALINGRUN_FRAMEWORK:-keras}" = pytorch-lightning ]; then
    packages=""
  elif ls /tmp/scalingrun-cache/wheels/horovod-*/horovod-*.whl >/dev/null 2>&1; then
    packages="binutils"
  else
    compiles=yes
  fi
fi

has_python_headers() {
  python3.11 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}

if [ -z "$packages" ] && command -v python3.11 >/dev/null 2>&1; then exit 0; fi
apt-get update -qq
if ! command -v python3.11 >/dev/null 2>&1; then
  if [ "$ID" = ubuntu ]; then
    apt-get install -y -qq --no-install-recommends software-properties-common gpg-agent >/dev/null
    add-apt-repository -y ppa:deadsnakes/ppa >/dev/null
    apt-get purge -y -qq --auto-remove software-properties-common gpg-agent >/dev/null
  fi
  packages="$packages python3.11 python3.11-venv"
  [ "$mode" = runtime ] || packages="$packages python3.11-dev"
elif [ "$compiles" = yes ] && ! has_python_headers; then
  packages="$packages python3.11-dev"
fi
# shellcheck disable=SC2086  # a list of package names
apt-get install -y -qq --no-install-recommends $packages >/dev/null
rm -f /etc/ssh/ssh_host_*
rm -rf /var/lib/apt/lists/*
