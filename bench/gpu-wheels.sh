#!/usr/bin/env bash
# The Python 3.12 wheels that bench/gpu.py needs on the GPU machine and its image lacks (the device tool's machine:
# CUDA torch, Lightning, mpi4py, numpy 2, a new pyarrow; no registry there). Run here, with network; the wheels go to
# .whl/ (ignored by .gitignore) and travel with `carry: [".whl"]` (at most 64 MiB with the working tree).
#
# Why numpy 1.26 and pyarrow 14 travel although the image has newer ones: our reader is Petastorm 0.13.1's, which
# imports `pyarrow.filesystem` (removed in pyarrow 15) and whose pyarrow < 15 is built against numpy 1.x
# ("numpy.core.multiarray failed to import" under numpy 2). Preprocessing alone runs on numpy 2.3 + pyarrow 22.
# pyarrow 14.0.2 is the last release with a cp312 wheel that Petastorm can import.
#
# Usage: bash bench/gpu-wheels.sh [DIR]      (DIR default .whl; prints the total size)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
python=${PYTHON:-python3}
mkdir -p "$dir"
wheels=(
  # the trainer's config and API models (scalingrun_api): pydantic 2 and what it needs beyond typing-extensions
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5
  # the reader (core/dataset.py) and what Petastorm imports on that path
  petastorm==0.13.1 dill==0.4.1 diskcache==5.6.3 future==1.0.0 pyarrow-hotfix==0.7
  numpy==1.26.4 pyarrow==14.0.2
)
# The device README's flags, as written there.
"$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "${wheels[@]}"
du -ch "$dir"/*.whl | tail -n1
