"""What every part of the API shares: group, version, patterns, the quantity and batch-size types, the base model."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Mapping, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, ValidationInfo, WithJsonSchema
from pydantic_core import PydanticCustomError
from pydantic.alias_generators import to_camel

GROUP = "scalingrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ScalingRun"
# The child that trains a run: mpi-operator v0.8's MPIJob, the one API version ScalingRuns create (builders),
# watch (handlers), write (cluster/k8s.py) and look for (preflight, the quick start).
MPIJOB_GROUP, MPIJOB_VERSION, MPIJOB_PLURAL = "kubeflow.org", "v2beta1", "mpijobs"
MPIJOB_API_VERSION = f"{MPIJOB_GROUP}/{MPIJOB_VERSION}"
# Every object the operator makes carries this label; its watches select on it.
MANAGED_BY_LABEL, MANAGER = "app.kubernetes.io/managed-by", "scalingrun-operator"
MANAGED_BY = {MANAGED_BY_LABEL: MANAGER}
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER}"
PLURAL = "scalingruns"
SINGULAR = "scalingrun"
SHORT_NAMES = ["srun"]
# `kubectl get scaling` lists runs and sweeps. A category named like a resource ("scalingrun") would be
# expanded by kubectl before the resource, so `kubectl get scalingrun NAME` would ask for two resources.
CATEGORIES = ["all", "scaling"]

# One image scheme everywhere (scripts/build-images.sh builds these names, release.yml publishes them):
# <REGISTRY>/operator:<version> and <REGISTRY>/trainer:<version>-<flavour>, the flavours in TRAINER_FLAVOURS.
# tests/unit/repository/test_image_names.py checks the chart, kustomize, Dockerfiles, docs and examples against them.
IMAGE_REGISTRY = "ghcr.io/scalingrun"
IMAGE_VERSION = "0.1.0"  # the project's version (pyproject.toml), the chart's appVersion
OPERATOR_IMAGE = f"{IMAGE_REGISTRY}/operator:{IMAGE_VERSION}"
# The default trainer images are "<repository>:<tag>-<flavour>"; the operator's SCALINGRUN_TRAINER_IMAGES (chart
# value trainerImages) replaces "<repository>:<tag>" for every flavour at once.
DEFAULT_TRAINER_IMAGES = f"{IMAGE_REGISTRY}/trainer:{IMAGE_VERSION}"
TRAINER_FLAVOURS = ("cpu", "lightning-cpu", "gpu", "lightning-gpu")


# Image references, one set of rules for validate, admission (the CRD's pattern), the operator's settings and the
# chart's values.schema.json: [registry[:port]/]path[:tag][@sha256:<64 hex>]. ASCII classes only (no \s or \w,
# which are Unicode to pydantic's regexps and ASCII to the API server's).
_NAME_COMPONENT = r"[a-z0-9]+([._-]+[a-z0-9]+)*"
_REPOSITORY = rf"[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]+)?(/{_NAME_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST_PATTERN = r"^sha256:[a-f0-9]{64}$"
IMAGE_REPOSITORY_PATTERN = rf"^{_REPOSITORY}$"
# The chart's image.tag and trainerImages.tag, image.digest: empty is allowed there (the appVersion; no digest).
OPTIONAL_TAG_PATTERN = rf"^({_TAG})?$"
OPTIONAL_DIGEST_PATTERN = r"^(sha256:[a-f0-9]{64})?$"
IMAGE_REFERENCE_PATTERN = rf"^{_REPOSITORY}(:{_TAG})?(@sha256:[a-f0-9]{{64}})?$"
# The operator's trainerImages: a repository and a tag that the flavours extend (…:0.1.0 -> …:0.1.0-cpu), so no
# digest: a digest names one image, pinned per flavour (TRAINER_IMAGE_DIGESTS).
TRAINER_IMAGES_PATTERN = rf"^{_REPOSITORY}:{_TAG}$"


def trainer_image_name(flavour: str, images: str = DEFAULT_TRAINER_IMAGES,
                       digests: Optional[Mapping[str, str]] = None) -> str:
    """The trainer image of a flavour (cpu, lightning-cpu, ...) under IMAGES ("<repository>:<tag>"), pinned by its
    digest when `digests` (flavour -> "sha256:...") has one: the tag stays for people, the digest is what is run."""
    digest = (digests or {}).get(flavour)
    return f"{images}-{flavour}@{digest}" if digest else f"{images}-{flavour}"


# The trainer image of a keras run without GPUs when spec.workers.image is not set (TensorFlow and Horovod, CPU build;
# with GPUs the -gpu flavour, scalingrun_api.engines).
DEFAULT_TRAINER_IMAGE = f"{DEFAULT_TRAINER_IMAGES}-cpu"  # = trainer_image_name("cpu")
# The trainer image of a pytorch-lightning run without GPUs when spec.workers.image is not set (torch, no
# TensorFlow/Horovod; with GPUs -lightning-gpu).
DEFAULT_LIGHTNING_TRAINER_IMAGE = f"{DEFAULT_TRAINER_IMAGES}-lightning-cpu"  # = trainer_image_name("lightning-cpu")

# s3:// (any S3-compatible store), file:// or an absolute local path.
DATA_URI_PATTERN = r"^(s3://[a-z0-9][a-z0-9.\-]{1,62}(/.*)?|file:///.*|/.*)$"
# What the trainer reads (scalingrun_trainer.core.weights.local_weights checks the same pattern): no gs:// or https://.
WEIGHTS_PATTERN = r"^(imagenet|none|s3://.+|file:///.+|/.+)$"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # a DNS subdomain, as Secret names are
# The host part in ASCII (RFC 3986 authority characters): no \s, which is Unicode to pydantic's regexps and
# ASCII to the API server's (a non-breaking space was taken by one and refused by the other).
HTTP_URL_PATTERN = r"^https?://[-A-Za-z0-9._~%!$&'()*+,;=:@\[\]]+(/.*)?$"
DNS_SUBDOMAIN_PATTERN = SECRET_NAME_PATTERN  # PriorityClass and Volcano queue names too
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"  # at most 63 characters
# An extended resource name, as a device plugin advertises it: <domain>/<name> (nvidia.com/gpu,
# nvidia.com/mig-3g.40gb, amd.com/gpu). Not in kubernetes.io's domains: the API server's rule, checked in validation
# (RE2 has no lookahead to say it here).
EXTENDED_RESOURCE_PATTERN = (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                             r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# A positive Kubernetes resource quantity, e.g. 500m, 4, 16Gi: some digit other than 0 (no zero CPU or memory).
# No lookahead: the API server's regexps (RE2) and pydantic's (Rust) have none.
QUANTITY_PATTERN = r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"

# The API server's integers are int64: a larger JSON number decodes as a float and is refused as "number".
INT64_MAX = 2**63 - 1
# And a number written as a float (1e16, 2.0) is an integer to it only below 2^53 (JSON's safe integers),
# while pydantic takes any whole float. Every integer field without a smaller bound carries this one
# (le=MAX_INTEGER, maximum in the CRD), so both refuse what lies beyond, however it is written.
MAX_INTEGER = 2**53 - 1


QUANTITY_NUMBER = "quantity_number"  # the error type of a fraction written as a number, e.g. cpu: 0.5


def quantity_fix(number: float, field: str) -> str:
    """How NUMBER, written where FIELD's quantity is due, is written as one: 0.5 CPU is "500m"; a fraction of memory
    is most often meant in Gi."""
    text = f"{number:g}"
    if number <= 0:
        return 'write a positive quantity string such as "500m", "2" or "16Gi"'
    if field.startswith("cpu"):
        millicores = Decimal(repr(number)) * 1000
        if number.is_integer():
            return f'write "{int(number)}" (a quantity string)'
        if millicores == millicores.to_integral_value():
            return f'write "{int(millicores)}m" (a quantity string)'
        return 'write whole millicores such as "1m" or "500m" (a quantity string; 1000m is one CPU)'
    if "e" in text:
        return 'write a quantity string such as "512Mi" or "16Gi"'
    return f'write a quantity string such as "{text}Gi" (if you meant gibibytes)'


def _quantity(value: object, info: ValidationInfo) -> object:
    """An integer quantity becomes its string; one beyond int64 is refused, as the API server refuses it; a fraction
    (cpu: 0.5), which the API server refuses too, gets its fix."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value > INT64_MAX:
            raise PydanticCustomError("quantity", f"Input should be at most {INT64_MAX} (int64), or a string")
        return str(value)
    if isinstance(value, float):
        raise PydanticCustomError(QUANTITY_NUMBER, f"{quantity_fix(value, info.field_name or '')}, not the number "
                                  f"{value!r}")
    return value


# Users write `cpu: 4` or `memory: 16Gi`; kept as a string, declared int-or-string in the CRD.
Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    Field(pattern=QUANTITY_PATTERN),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}], "pattern": QUANTITY_PATTERN}
    ),
]

_QUANTITY_SUFFIXES = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                      "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60}


def quantity_value(quantity: str | int) -> float:
    """A Quantity as a number: '500m' -> 0.5 (cores), '2' -> 2.0, '1Ki' -> 1024.0."""
    text = str(quantity)
    number = text.rstrip("kKMGTPEim")
    return float(number) * _QUANTITY_SUFFIXES[text[len(number):]]


AUTO = "auto"
MAX_BATCH_SIZE = 65536


def _batch_size(value: object) -> int | str:
    """An integer in [1, 65536] or "auto"; strict: "32" (a string) is not 32."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int):
        raise PydanticCustomError("batch_size", 'Input should be a valid integer >= 1 or "auto"')
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise PydanticCustomError("batch_size", f"Input should be greater than or equal to 1 and at most "
                                  f"{MAX_BATCH_SIZE}, or \"auto\"")
    return value


# batchSizePerWorker: a number, or "auto" (a probe before training picks it). Int-or-string in the CRD: the
# bounds apply to integers and the pattern to strings.
BatchSize = Annotated[
    int | str,
    PlainValidator(_batch_size),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "minimum": 1, "maximum": MAX_BATCH_SIZE,
                    "pattern": f"^{AUTO}$"}),
]


# A length of time: whole seconds (90), or Go's units in order (1h30m, 10m, 45s). Int-or-string in the CRD.
DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
_DURATION_PART = re.compile(r"([0-9]+)([hms])")
_DURATION_UNITS = {"h": 3600, "m": 60, "s": 1}


def duration_seconds(value: int | str) -> int:
    """A Duration in seconds: 90 -> 90, '1h30m' -> 5400, '45s' -> 45."""
    if isinstance(value, int):
        return value
    return sum(int(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(value))


def _duration(value: object) -> int | str:
    if isinstance(value, bool):
        raise PydanticCustomError("duration", "Input should be seconds (90) or a duration such as 10m or 1h30m")
    if isinstance(value, int):
        if not 0 <= value <= MAX_INTEGER:
            raise PydanticCustomError("duration", f"Input should be between 0 and {MAX_INTEGER} seconds")
        return value
    if isinstance(value, str) and value and re.fullmatch(DURATION_PATTERN, value):
        if duration_seconds(value) > MAX_INTEGER:
            raise PydanticCustomError("duration", f"Input should be at most {MAX_INTEGER} seconds")
        return value
    raise PydanticCustomError("duration", "Input should be seconds (90) or a duration such as 10m or 1h30m")


Duration = Annotated[
    int | str,
    PlainValidator(_duration),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "minimum": 0, "maximum": MAX_INTEGER,
                    "pattern": DURATION_PATTERN}),
]


def _duration_or_auto(value: object) -> int | str:
    return AUTO if value == AUTO else _duration(value)


# A duration, or "auto" (the field says what auto means).
DurationOrAuto = Annotated[
    int | str,
    PlainValidator(_duration_or_auto),
    WithJsonSchema({"x-kubernetes-int-or-string": True, "minimum": 0, "maximum": MAX_INTEGER,
                    "pattern": f"^({AUTO}|([0-9]+h)?([0-9]+m)?([0-9]+s)?)$"}),
]


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields rejected (a typo must not silently become a default)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,  # enum defaults become plain strings too
    )


def secret_name_field(description: str):
    """An optional reference to a Secret in the run's namespace, by name: never the values themselves."""
    return Field(None, description=description, pattern=SECRET_NAME_PATTERN, max_length=253)


def _secret_name(value: object) -> object:
    """A Secret's name; `name: regcred`, as a pod spec writes it, gets the spelling this API takes."""
    if isinstance(value, dict) and set(value) == {"name"}:
        raise PydanticCustomError("secret_name", f"write the Secret's name alone (- {value['name']}), not an object")
    return value


# A Secret in the run's namespace, by name (a list of them: imagePullSecrets). The constraints before the
# validator: after it, pydantic leaves the pattern out of the JSON schema, and so out of the CRD.
SecretName = Annotated[str, Field(description="Name of a Secret in the run's namespace.", pattern=SECRET_NAME_PATTERN,
                                   max_length=253), BeforeValidator(_secret_name)]


class ObjectMeta(BaseModel):
    """The parts of metadata we read; the rest is kept as is."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(..., min_length=1, max_length=40, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    namespace: Optional[str] = None
