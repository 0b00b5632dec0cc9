#!/usr/bin/env bash
# Checks a built image against this checkout's locks (docs/security.md, "Verify an image"): runs
# scripts/verify_installed.py with the image's own Python over its venv (/opt/scalingrun). Exit 1 on any
# difference: a package not in the locks or at another version, a pinned one missing, or an installed file
# whose sha256 is not the one pip recorded when it installed the hash-checked wheel.
# Usage: scripts/verify-image.sh IMAGE operator|trainer|lightning
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${1:?usage: scripts/verify-image.sh IMAGE operator|trainer|lightning}"
modified=()
case "${2:?flavour: operator, trainer or lightning}" in
  operator) locks=(operator bootstrap) ;;
  # Dockerfile.trainer strips Horovod's debug symbols after installing it: its .so files differ by design.
  trainer) locks=(trainer bootstrap petastorm horovod); modified=(--modified 'horovod/*.so') ;;
  lightning) locks=(lightning torch-cpu bootstrap petastorm) ;;
  *) echo "flavour must be operator, trainer or lightning" >&2; exit 2 ;;
esac
args=()
for lock in "${locks[@]}"; do args+=("/locks/$lock.txt"); done
"${DOCKER:-docker}" run --rm --user 0 --entrypoint /opt/scalingrun/bin/python \
  -v "$ROOT/requirements:/locks:ro" -v "$ROOT/scripts/verify_installed.py:/verify_installed.py:ro" \
  "$IMAGE" /verify_installed.py "${modified[@]}" "${args[@]}"
