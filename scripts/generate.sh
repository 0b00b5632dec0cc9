#!/usr/bin/env bash
# Regenerates the checked-in CRD (manifests/ and chart) from the pydantic models.
# tests/unit/test_crd.py fails when these files drift from the models.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
mkdir -p "$ROOT/manifests/crd" "$ROOT/charts/scalingrun/templates"
"$PY" -c 'from scalingrun_operator.api.crd import render_crd_yaml; print(render_crd_yaml(), end="")' \
  > "$ROOT/manifests/crd/scalingrun.dev_scalingruns.yaml"
"$PY" -c 'from scalingrun_operator.api.crd import render_chart_crd_template; print(render_chart_crd_template(), end="")' \
  > "$ROOT/charts/scalingrun/templates/crd.yaml"
echo "generated manifests/crd/scalingrun.dev_scalingruns.yaml and charts/scalingrun/templates/crd.yaml"
