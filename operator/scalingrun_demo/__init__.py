"""The cluster quick start (`scripts/quickstart.sh --cluster`): tooling that runs docker, helm and kubectl from a
checkout of the repository (its chart, Dockerfiles and examples). It uses the operator's package; the operator never
imports it, and the images leave it out (.dockerignore)."""
