"""Image references that one set of rules (scalingrun_api.models.common.IMAGE_REFERENCE_PATTERN) accepts or refuses:
the same table for validate, admission (the CRD's pattern), the operator's settings and the chart."""

from __future__ import annotations

DIGEST = "sha256:" + "0123456789abcdef" * 4

ACCEPTED = [
    "ghcr.io/scalingrun/trainer:0.1.0-cpu",
    f"ghcr.io/scalingrun/trainer@{DIGEST}",  # by digest alone
    f"ghcr.io/scalingrun/trainer:0.1.0-cpu@{DIGEST}",  # a tag for people, the digest to run
    f"registry.example.com:5000/ml/team_a/trainer@{DIGEST}",
    "ubuntu",
    "local/scalingrun-trainer:dev",
]

REFUSED = [
    "ghcr.io/scalingrun/trainer@sha256:abc",  # a digest is 64 hex digits
    "ghcr.io/scalingrun/trainer@sha256:" + "0123456789ABCDEF" * 4,  # lower-case hex, as registries print it
    "ghcr.io/scalingrun/trainer@sha1:" + "0123456789abcdef" * 4,
    f"ghcr.io/scalingrun/trainer:@{DIGEST}",  # an empty tag
    f"ghcr.io/scalingrun/trainer@{DIGEST}:0.1.0",  # the tag after the digest
    "ghcr.io/scalingrun/trainer:0.1.0 cpu",
    "ghcr.io/Scalingrun/Trainer:0.1.0",  # a path is lower case
]
