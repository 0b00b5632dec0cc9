#!/usr/bin/env bash
# Makes a used machine new to the project again, so that the README's test command can be timed cold on it
# (docs/testing.md, "Cold means new"): removes what scripts/setup.sh, scripts/test.sh and the builders it calls
# installed or cached. Destructive: it asks for --yes.
#
#   scripts/as-new.sh --yes --packages-of-new-machine FILE
#
# FILE lists the Debian packages the machine had when it was new, one a line: a bare name, or `apt NAME VERSION`
# (tab- or space-separated, lines starting with # skipped), e.g. the machine image's package list. Every Debian
# package installed now and not in FILE is purged (with what only it pulled in). Without FILE no package is
# removed, and the run is only "cold" (caches and images gone, system packages kept).
# Also removed: the checkout's venvs and .scalingrun/, ~/.cache/scalingrun, pip's cache, the envtest and node
# builders' caches (~/.cache/envtest-debian-1.20.2, ~/.cache/k8s-node-1.20.2), every Docker image, container and
# volume (dockerd stopped, /var/lib/docker removed), and the deb-src list the API server's builder added.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
YES=0 BASELINE=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --yes) YES=1 ;;
    --packages-of-new-machine) BASELINE="$2"; shift ;;
    *) echo "usage: $0 --yes [--packages-of-new-machine FILE]" >&2; exit 2 ;;
  esac
  shift
done
[[ "$YES" == 1 ]] || { echo "this removes caches, venvs, Docker's data and packages: pass --yes" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run as root: it purges Debian packages and Docker's data" >&2; exit 2; }
log() { printf '[as-new] %s\n' "$*" >&2; }
CACHE_HOME="${XDG_CACHE_HOME:-$HOME/.cache}"

# Clusters and daemons first: nothing may hold the files removed below.
bash "$ROOT/../shared/node/cluster.sh" stop >/dev/null 2>&1 || true
pkill -x dockerd 2>/dev/null || true
pkill -x containerd 2>/dev/null || true
sleep 2
rm -rf /var/lib/docker /var/lib/containerd
log "Docker's images, containers and volumes removed"

rm -rf "$ROOT/.venv" "$ROOT/.venv-lightning" "$ROOT/.venv-mlflow" "$ROOT/.venv-cluster" "$ROOT/.scalingrun" \
  "$ROOT/build" "$CACHE_HOME/scalingrun" "$CACHE_HOME/pip" "$CACHE_HOME/envtest-debian-1.20.2" \
  "$CACHE_HOME/k8s-node-1.20.2" "$CACHE_HOME/go-build"
rm -f /etc/apt/sources.list.d/debian-src.sources
log "venvs, caches and the deb-src list removed"

if [[ -n "$BASELINE" ]]; then
  # Never an essential, required or important package, whatever FILE says (a wrong FILE must not break the system).
  mapfile -t extra < <(comm -23 <(dpkg-query -W -f='${Package} ${Essential} ${Priority}\n' \
      | awk '$2 != "yes" && $3 != "required" && $3 != "important" {print $1}' | sed 's/:.*//' | sort -u) \
    <(grep -v '^#' "$BASELINE" | awk 'NF == 1 {print $1} NF > 1 && $1 == "apt" {print $2}' | sed 's/:.*//' | sort -u))
  if ((${#extra[@]})); then
    log "purging ${#extra[@]} Debian packages the new machine did not have: ${extra[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${extra[@]}" >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get autoremove --purge -y -qq >/dev/null
  fi
  apt-get clean
fi
log "done: the next scripts/test.sh starts from nothing the project installed"
