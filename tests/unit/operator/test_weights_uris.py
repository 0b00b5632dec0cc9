"""spec.model.weights: validate, admission (the CRD's pattern, the same string) and the trainer accept the same
URIs (issue 23, item 3): a URI the trainer cannot read is refused at `kubectl apply`, not after preprocessing."""

from __future__ import annotations

import pytest

from scalingrun_api import models
from scalingrun_operator.schema.crd import build_crd
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun


def test_the_crd_carries_the_models_weights_pattern():
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["model"]["properties"]["weights"]["pattern"] == models.WEIGHTS_PATTERN


def test_weights_uris_that_validate_takes_are_those_the_trainer_reads(tmp_path):
    """spec.model.weights: one pattern for validate and admission (the CRD), and the trainer refuses the same
    URIs at once, instead of after preprocessing."""
    from scalingrun_trainer.core.weights import ModelError, local_weights

    weights = tmp_path / "w.h5"
    weights.write_bytes(b"weights")
    accepted = ["imagenet", "none", f"file://{weights}", str(weights), "s3://bucket/weights/w.h5"]
    refused = ["gs://bucket/w.h5", "https://example.com/w.h5", "http://host/w.h5", "file://host/w.h5",
               "imagenet21k", "bucket/w.h5", "ftp://host/w.h5"]
    for uri in accepted + refused:
        spec = {"apiVersion": models.API_VERSION, "kind": models.KIND, "metadata": {"name": "w"},
                "spec": {"storage": {"credentialsSecret": "s"}, "model": {"weights": uri},
                         "dataset": {"source": "s3://bucket/raw", "output": "s3://bucket/parquet"}}}
        try:
            parse_scalingrun(spec)
            validated = True
        except InvalidScalingRun as exc:
            assert [e.path for e in exc.errors] == ["spec.model.weights"], exc
            validated = False
        assert validated == (uri in accepted), uri
        if uri in refused:
            with pytest.raises(ModelError, match="spec.model.weights"):
                local_weights(uri)
        elif not uri.startswith("s3://"):  # s3:// is read from storage; none here
            assert local_weights(uri) in (None, "imagenet", str(weights)), uri
