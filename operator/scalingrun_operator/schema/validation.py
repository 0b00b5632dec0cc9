"""Validation of ScalingRun documents, with one message per bad field.

The CRD schema rejects what it can at admission, and `parse_schema` accepts and rejects the same specs
(tests/integration/test_validation_admission.py checks both on generated specs); unknown fields, which
the API server prunes (or refuses, under kubectl's strict field validation), are rejected here in any
spelling, snake_case too, with the name meant (field_errors.py); a duplicate key is refused where YAML is
read (strict_yaml.py). The rules a 1.20-era schema cannot express (cross-field rules) run in `scalingrun
validate` and in the operator, where they become an `InvalidSpec` condition instead of a crash loop.
ScalingRuns and ScalingSweeps go through the same `parse_schema`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Iterable, TypeVar

import pydantic

from scalingrun_api.engines import ENGINES, framework_engine
from scalingrun_api.models import (
    AUTO, FRAMEWORK_STRATEGIES, Columns, DatasetFormat, Framework, Monitor, Preprocessing, ScalingRun, ScalingSweep,
    StorageCredentials, quantity_value,
)
from scalingrun_api.models.common import MAX_INTEGER
from scalingrun_api.models.dataset import Dataset
from .field_errors import schema_errors
from .findings import FieldError, InvalidScalingRun, SpecWarning
from .pod_overrides import pod_override_errors
from .sweep import build_point_run, sweep_points
from .workers import workers_errors, workers_warnings

Resource = TypeVar("Resource", bound=pydantic.BaseModel)


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


def semantic_errors(run: ScalingRun, allow_host_path: bool = False) -> list[FieldError]:
    """Cross-field rules that the CRD schema cannot express; `allow_host_path`: the operator's runs.allowHostPath."""
    spec = run.spec
    errors: list[FieldError] = []
    uses_s3 = s3_fields(run)
    pod_identity = spec.storage.credentials == StorageCredentials.pod_identity.value
    if pod_identity and spec.storage.credentials_secret:
        errors.append(FieldError(
            "spec.storage.credentialsSecret",
            "not used when spec.storage.credentials is podIdentity (the pods' identity gives the keys): "
            "remove it, or set credentials to secret"))
    elif uses_s3 and not pod_identity and not spec.storage.credentials_secret:
        errors.append(
            FieldError(
                "spec.storage.credentialsSecret",
                f"required because s3:// is used by {', '.join(uses_s3)}: name a Secret holding "
                f"{spec.storage.access_key_id_key} and {spec.storage.secret_access_key_key}, or set "
                "spec.storage.credentials: podIdentity when the pods' ServiceAccount has an IAM role "
                "(IRSA, EKS Pod Identity)",
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
    errors += _own_model_errors(run)
    errors += _dataset_format_errors(run)
    errors += _cpu_limit_errors(run)
    errors += workers_errors(run)
    errors += pod_override_errors(run, allow_host_path)
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


def _cpu_limit_errors(run: ScalingRun) -> list[FieldError]:
    """A CPU limit below the request: the API server would refuse the pods only when they are created."""
    spec = run.spec
    errors = []
    for path, cpu, limit in (
        ("spec.workers", spec.workers.cpu, spec.workers.cpu_limit),
        ("spec.launcher.resources", spec.launcher.resources.cpu, spec.launcher.resources.cpu_limit),
        ("spec.dataset.preprocessing.resources", spec.dataset.preprocessing.resources.cpu,
         spec.dataset.preprocessing.resources.cpu_limit),
    ):
        if cpu and limit and quantity_value(limit) < quantity_value(cpu):
            errors.append(FieldError(f"{path}.cpuLimit", f"must be at least {path}.cpu ({cpu}), got {limit}: "
                                     "raise it, or remove it for a limit equal to cpu"))
    return errors


def _as_admitted(node: Any) -> Any:
    """The document as the API server reads it: nulls pruned (nothing in the schema is nullable, so a null
    field takes its default), and a whole float such as 2.0 is the JSON number 2, an integer, below 2^53 only:
    beyond, the server keeps it a float (refused where an integer or a quantity is due)."""
    if isinstance(node, Mapping):
        return {key: _as_admitted(value) for key, value in node.items() if value is not None}
    if isinstance(node, list):
        return [_as_admitted(value) for value in node]
    if isinstance(node, float) and node.is_integer() and abs(node) <= MAX_INTEGER:
        return int(node)
    return node


# Free-form objects (x-kubernetes-preserve-unknown-fields): the API server checks nothing inside them.
FREE_FORM_PATHS = ("model.params", "volumes", "valueFrom", "affinity", "topologySpreadConstraints")


def _empty_strings(node: Any, path: str) -> Iterable[str]:
    if re.sub(r"\[[0-9]+\]$", "", path).endswith(FREE_FORM_PATHS):
        return
    if node == "":
        yield path
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _empty_strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _empty_strings(value, f"{path}[{index}]")


def parse_schema(document: Any, resource: type[Resource] = ScalingRun) -> Resource:
    """The checks the CRD schema makes at admission (types, enums, bounds, patterns) plus unknown fields,
    which the API server prunes instead; raises InvalidScalingRun listing every bad field. Any resource
    model of the API (ScalingRun by default) with its CRD generated from it."""
    if not isinstance(document, dict):
        raise InvalidScalingRun([FieldError("(document)", f"must be a mapping (a {resource.__name__} object)")])
    # Kubernetes adds server-side metadata and status; only the spec is the user's input.
    admitted = _as_admitted(document)
    run, failed = None, None
    try:
        # Strict JSON, as the API server types it: no '4' for 4, no 'yes' for true, no 2.5 for an integer.
        run = resource.model_validate_json(json.dumps(admitted, default=str), strict=True)
    except pydantic.ValidationError as exc:
        failed = exc
    errors = schema_errors(admitted, resource, failed)
    # 1.20 refuses an empty string in any field ("must be of type string: null"); the CRD says minLength 1.
    reported = {e.path for e in errors}
    spec = admitted.get("spec")
    errors += [FieldError(path, "must not be empty (got '')")
               for path in (_empty_strings(spec, "spec") if isinstance(spec, dict) else ()) if path not in reported]
    if errors:
        raise InvalidScalingRun(errors)
    return run


def _framework_errors(run: ScalingRun) -> list[FieldError]:
    """Fields that mean nothing for the chosen framework are refused, not ignored."""
    spec = run.spec
    errors = []
    strategies = FRAMEWORK_STRATEGIES[spec.training.framework]
    if spec.training.strategy not in strategies:
        errors.append(FieldError(
            "spec.training.strategy",
            f"{spec.training.strategy} is not a strategy of spec.training.framework {spec.training.framework} "
            f"(its strategies: {', '.join(strategies)}; the first is the default when strategy is omitted)",
        ))
    # What the framework trains and reads is its default engine's (a strategy outside it is refused above).
    chosen = framework_engine(spec.training.framework)
    if chosen.bases is not None and spec.model.base not in (None, *chosen.bases):
        errors.append(FieldError(
            "spec.model.base",
            f"{spec.model.base} is a Keras application (its ImageNet weights are Keras files); "
            f"training.framework {chosen.framework} trains {' or '.join(chosen.bases)} only: use "
            f"{' or '.join(chosen.bases)} or framework {Framework.keras.value}",
        ))
    weights = spec.model.weights
    suffixes = chosen.weights_suffixes
    if suffixes is not None and weights not in (None, "imagenet", "none") and not weights.endswith(suffixes):
        errors.append(FieldError(
            "spec.model.weights",
            f"{chosen.framework} reads a PyTorch state dict ({' or '.join(suffixes)}), got {weights!r}",
        ))
    return errors


def _own_model_errors(run: ScalingRun) -> list[FieldError]:
    """model.builder and training.command replace the built-in network: the fields of that network are refused
    beside them (named), not silently ignored."""
    model, training = run.spec.model, run.spec.training
    errors = []
    builtin = [f"spec.model.{name}" for name in model.builtin_fields_set()]
    if training.command:
        if model.builder:
            errors.append(FieldError("spec.model.builder", "training.command runs your own script, which builds its "
                                     "own network: remove model.builder (or training.command, to train the builder "
                                     "with our trainer)"))
        errors += [FieldError(path, f"training.command does not use {path} (your script builds its own network): "
                              "remove it") for path in builtin]
        if training.batch_size_per_worker == AUTO:
            errors.append(FieldError("spec.training.batchSizePerWorker", "auto probes our trainer's network; with "
                                     "training.command give a number (your script reads it as "
                                     "ctx.batch_size_per_worker)"))
        chosen = ENGINES.get((training.framework, training.strategy))
        if chosen is not None and not chosen.process_per_gpu:
            errors.append(FieldError("spec.training.strategy", "training.command runs your script on every rank "
                                     f"under mpirun (one process per GPU): {training.strategy} is our Keras "
                                     "trainer's engine; remove strategy (your script may use any strategy itself)"))
    elif model.builder:
        errors += [FieldError(path, f"{path} and spec.model.builder exclude each other: the builder's network has "
                              "its own layers and weights; remove one of them") for path in builtin]
    elif model.params is not None:
        errors.append(FieldError("spec.model.params", "keyword arguments of spec.model.builder (or read by "
                                 "training.command's script): set one of them, or remove params"))
    return errors


def _dataset_format_errors(run: ScalingRun) -> list[FieldError]:
    """Fields of one dataset format that mean nothing for the other are refused when they differ from their
    default (a default cannot be told from a value the user wrote)."""
    dataset = run.spec.dataset
    errors = []
    if dataset.format == DatasetFormat.parquet.value:
        fields = [("validationFraction", dataset, Dataset, "validation_fraction"),
                  ("sampleFraction", dataset, Dataset, "sample_fraction"),
                  ("preprocessing.parallelism", dataset.preprocessing, Preprocessing, "parallelism"),
                  ("preprocessing.maxBadFraction", dataset.preprocessing, Preprocessing, "max_bad_fraction")]
        for path, node, model, name in fields:
            if getattr(node, name) != model.model_fields[name].default:
                errors.append(FieldError(f"spec.dataset.{path}", "a JPEG tree's preprocessing setting: with "
                                         "dataset.format parquet the table is read as it is (its own train/ and "
                                         "validation/ folders); remove it"))
    else:
        for name in ("image", "label"):
            if getattr(dataset.columns, name) != Columns.model_fields[name].default:
                errors.append(FieldError(f"spec.dataset.columns.{name}", "column names are for dataset.format "
                                         f"parquet; the preprocessing of a jpeg-tree writes column {name}"))
    return errors


def parse_scalingrun(document: Any, allow_host_path: bool = False) -> ScalingRun:
    """Parses and validates one ScalingRun document; raises InvalidScalingRun listing every bad field."""
    run = parse_schema(document)
    errors = semantic_errors(run, allow_host_path)
    if errors:
        raise InvalidScalingRun(errors)
    return run


def spec_warnings(run: ScalingRun) -> list[SpecWarning]:
    """What a valid run may not mean: `scalingrun validate` prints these, the operator posts them as Events."""
    return workers_warnings(run)


def sweep_warnings(sweep: ScalingSweep) -> list[SpecWarning]:
    """Every point's warnings, once each, at its spec.template path (each point run posts its own Events)."""
    found: dict[str, SpecWarning] = {}
    for point in sweep_points(sweep):
        for warning in spec_warnings(parse_scalingrun(build_point_run(sweep, point))):
            path = "spec.template." + warning.path[len("spec."):]
            found.setdefault(path, SpecWarning(warning.reason, path, warning.message))
    return list(found.values())


def sweep_semantic_errors(sweep: ScalingSweep, allow_host_path: bool = False) -> list[FieldError]:
    """The sweep's own cross-field rules, then every point's ScalingRun rules (as spec.template.* paths)."""
    spec = sweep.spec
    errors: list[FieldError] = []
    duplicates = sorted({w for w in spec.workers if spec.workers.count(w) > 1})
    if duplicates:
        errors.append(FieldError("spec.workers", f"worker counts must be unique; repeated: {duplicates}"))
    if spec.gpus_per_worker is not None and len(spec.gpus_per_worker) != len(spec.workers):
        errors.append(FieldError("spec.gpusPerWorker", f"needs one entry per point: {len(spec.workers)} "
                                 f"(as many as spec.workers), got {len(spec.gpus_per_worker)}"))
    if spec.template.workers.min_replicas is not None or spec.template.workers.resize_after is not None:
        # A point measures one size: a resized point's throughput and time would be a mix of sizes.
        field = "minReplicas" if spec.template.workers.min_replicas is not None else "resizeAfter"
        errors.append(FieldError(f"spec.template.workers.{field}", "a sweep measures each point at its own fixed "
                                 "worker count, and a resized point would mix sizes in its row: remove it (run an "
                                 "elastic ScalingRun on its own)"))
    if errors:
        return errors
    seen: set[str] = set()
    for point in sweep_points(sweep):
        try:
            parse_scalingrun(build_point_run(sweep, point), allow_host_path)
        except InvalidScalingRun as exc:
            for error in exc.errors:
                if error.path.startswith("metadata.name"):
                    error = FieldError("metadata.name", f"the point names (<name>-w<workers>, here {point.name!r}) "
                                       f"must be valid ScalingRun names: {error.message}")
                elif error.path.startswith("spec."):
                    error = FieldError("spec.template." + error.path[len("spec."):], error.message)
                key = error.path if error.path == "metadata.name" else str(error)
                if key not in seen:
                    seen.add(key)
                    errors.append(error)
    return errors


def parse_scalingsweep(document: Any, allow_host_path: bool = False) -> ScalingSweep:
    """Parses and validates one ScalingSweep document; raises InvalidScalingRun listing every bad field."""
    sweep = parse_schema(document, ScalingSweep)
    errors = sweep_semantic_errors(sweep, allow_host_path)
    if errors:
        raise InvalidScalingRun(errors)
    return sweep
