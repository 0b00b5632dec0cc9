"""Validation of ScalingRun documents, with one message per bad field.

The CRD schema rejects what it can at admission; the rules here that a 1.20-era schema cannot
express (cross-field rules) run in `scalingrun validate` and in the operator, where they become an
`InvalidSpec` condition instead of a crash loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pydantic

from .models import BaseNetwork, Framework, Monitor, ScalingRun


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class InvalidScalingRun(ValueError):
    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _path(loc: Iterable[Any]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(document)"


_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
}


def _pydantic_errors(exc: pydantic.ValidationError) -> list[FieldError]:
    errors = []
    for err in exc.errors(include_url=False):
        message = _MESSAGES.get(err["type"], err["msg"])
        if err["type"] not in ("missing",):
            message += f" (got {err['input']!r})" if not isinstance(err["input"], dict) else ""
        errors.append(FieldError(_path(err["loc"]), message))
    return errors


def s3_fields(run: ScalingRun) -> list[str]:
    """Paths of the spec fields whose URI is s3:// (they need the credentials Secret)."""
    spec = run.spec
    uris = {
        "spec.dataset.source": spec.dataset.source,
        "spec.dataset.output": spec.dataset.output,
        "spec.training.checkpoint.location": spec.training.checkpoint.location,
        "spec.model.weights": spec.model.weights,
    }
    return [path for path, uri in uris.items() if uri and uri.startswith("s3://")]


def semantic_errors(run: ScalingRun) -> list[FieldError]:
    """Cross-field rules that the CRD schema cannot express."""
    spec = run.spec
    errors: list[FieldError] = []
    uses_s3 = s3_fields(run)
    if uses_s3 and not spec.storage.credentials_secret:
        errors.append(
            FieldError(
                "spec.storage.credentialsSecret",
                f"required because s3:// is used by {', '.join(uses_s3)}: name a Secret holding "
                f"{spec.storage.access_key_id_key} and {spec.storage.secret_access_key_key}",
            )
        )
    source = spec.dataset.source.rstrip("/")
    output = spec.dataset.output.rstrip("/")
    if output == source or output.startswith(source + "/"):
        errors.append(
            FieldError(
                "spec.dataset.output",
                f"must not be inside spec.dataset.source ({spec.dataset.source}): "
                "its folders would be read as classes",
            )
        )
    stopping = spec.training.early_stopping
    if stopping.stopping_threshold is not None and stopping.monitor in (
        Monitor.accuracy.value,
        Monitor.val_accuracy.value,
    ):
        if not 0 < stopping.stopping_threshold <= 1:
            errors.append(
                FieldError(
                    "spec.training.earlyStopping.stoppingThreshold",
                    f"an accuracy threshold must be in (0, 1] (got {stopping.stopping_threshold})",
                )
            )
    errors += _framework_errors(run)
    gang = spec.run_policy.scheduling_policy
    pods = spec.workers.replicas + 1  # workers + launcher
    if gang and gang.min_available and gang.min_available > pods:
        errors.append(
            FieldError(
                "spec.runPolicy.schedulingPolicy.minAvailable",
                f"must be <= {pods} (workers.replicas + 1 launcher), got {gang.min_available}",
            )
        )
    return errors


def _framework_errors(run: ScalingRun) -> list[FieldError]:
    """Fields that mean nothing for the chosen framework are refused, not ignored."""
    spec = run.spec
    if spec.training.framework != Framework.pytorch_lightning.value:
        return []
    errors = []
    if spec.model.base != BaseNetwork.efficientnet_lite0.value:
        errors.append(FieldError(
            "spec.model.base",
            f"{spec.model.base} is a Keras application (its ImageNet weights are Keras files); "
            "training.framework pytorch-lightning trains efficientnet_lite0 only: use efficientnet_lite0 "
            "or framework keras",
        ))
    weights = spec.model.weights
    if weights not in ("imagenet", "none") and not weights.endswith((".pth", ".pt")):
        errors.append(FieldError(
            "spec.model.weights",
            f"pytorch-lightning reads a PyTorch state dict (.pth or .pt), got {weights!r}",
        ))
    return errors


def parse_scalingrun(document: Any) -> ScalingRun:
    """Parses and validates one ScalingRun document; raises InvalidScalingRun listing every bad field."""
    if not isinstance(document, dict):
        raise InvalidScalingRun([FieldError("(document)", "must be a mapping (a ScalingRun object)")])
    # Kubernetes adds server-side metadata and status; only the spec is the user's input.
    try:
        run = ScalingRun.model_validate(document)
    except pydantic.ValidationError as exc:
        raise InvalidScalingRun(_pydantic_errors(exc)) from None
    errors = semantic_errors(run)
    if errors:
        raise InvalidScalingRun(errors)
    return run
