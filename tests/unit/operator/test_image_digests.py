"""Images by digest: spec.workers.image, the operator's trainerImages with per-flavour digests, and one set of rules
for validate and the operator (admission: tests/integration/test_validation_admission.py; the chart:
tests/chart/test_chart_tenancy.py)."""

from __future__ import annotations

import re

import pytest

from scalingrun_api.engines import engine
from scalingrun_api.models.common import IMAGE_REFERENCE_PATTERN, TRAINER_FLAVOURS
from scalingrun_operator import config as config_module
from scalingrun_operator.config import ConfigError
from scalingrun_operator.decide.run import with_default_image
from scalingrun_operator.schema.validation import InvalidScalingRun, parse_scalingrun
from tests.support.image_refs import ACCEPTED, DIGEST, REFUSED
from tests.support.specs import run_document


def _with_image(image: str) -> dict:
    return run_document(workers={"image": image})


@pytest.mark.parametrize("image", ACCEPTED)
def test_validate_accepts_an_image_by_tag_or_digest(image):
    assert parse_scalingrun(_with_image(image)).spec.workers.image == image


@pytest.mark.parametrize("image", REFUSED)
def test_validate_refuses_a_malformed_reference_and_says_what_one_is(image):
    with pytest.raises(InvalidScalingRun) as refused:
        parse_scalingrun(_with_image(image))
    text = str(refused.value)
    assert "spec.workers.image" in text and "@sha256:<64 hex digits>" in text, text


def test_the_table_is_the_patterns():
    assert all(re.search(IMAGE_REFERENCE_PATTERN, image) for image in ACCEPTED)
    assert not any(re.search(IMAGE_REFERENCE_PATTERN, image) for image in REFUSED)


def test_the_default_trainer_images_are_pinned_by_their_flavours_digests():
    config = config_module.load({"SCALINGRUN_TRAINER_IMAGES": "registry.example.com/ml/trainer:1.2.0",
                                 "SCALINGRUN_TRAINER_IMAGE_DIGESTS": f"cpu={DIGEST}, lightning-gpu={DIGEST}"})
    digests = config.trainer_image_digest_map()
    assert digests == {"cpu": DIGEST, "lightning-gpu": DIGEST}
    keras = engine("keras", "horovod")
    pinned = f"registry.example.com/ml/trainer:1.2.0-cpu@{DIGEST}"
    assert keras.default_image(0, config.trainer_images, digests) == pinned
    assert keras.default_image(1, config.trainer_images, digests) == "registry.example.com/ml/trainer:1.2.0-gpu"
    run = with_default_image(parse_scalingrun(run_document(workers={"gpusPerWorker": 0})), config.trainer_images, True,
                             digests)
    assert run.spec.workers.image == f"registry.example.com/ml/trainer:1.2.0-cpu@{DIGEST}"
    assert re.search(IMAGE_REFERENCE_PATTERN, run.spec.workers.image)


@pytest.mark.parametrize("digests", ["cpu=sha256:abc", f"tpu={DIGEST}", DIGEST, f"cpu={DIGEST.upper()}"])
def test_a_malformed_digest_setting_stops_the_operator_at_start(digests):
    with pytest.raises(ConfigError, match="TRAINER_IMAGE_DIGESTS.*<flavour>=sha256:<64 hex digits>"):
        config_module.load({"SCALINGRUN_TRAINER_IMAGE_DIGESTS": digests})
    assert set(TRAINER_FLAVOURS) == {"cpu", "lightning-cpu", "gpu", "lightning-gpu"}


def test_trainer_images_take_no_digest_since_the_flavours_extend_the_tag():
    with pytest.raises(ConfigError, match="TRAINER_IMAGE_DIGESTS"):
        config_module.load({"SCALINGRUN_TRAINER_IMAGES": f"registry.example.com/ml/trainer:1.2.0@{DIGEST}"})
    assert config_module.load({"SCALINGRUN_TRAINER_IMAGES": "localhost:5000/trainer:1"}).trainer_images
