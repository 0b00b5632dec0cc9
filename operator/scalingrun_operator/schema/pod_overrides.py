"""spec.podOverrides' rules: what the operator (and the Job controller, mpi-operator) set on a run's pods cannot be
overridden, what two overrides give the same pods must not contradict (nothing is silently replaced), and hostPath
volumes only where the operator allows them (the chart's runs.allowHostPath; `scalingrun validate --allow-host-path`).
Privileged containers cannot be asked for at all: an override has no securityContext.

tests/unit/operator/test_pod_overrides.py renders every child and checks that the names reserved here cover all the
labels, variables, volumes and paths the builders set."""

from __future__ import annotations

import re
from typing import Any, Optional

from scalingrun_api.engines import ENGINES
from scalingrun_api.heartbeat import COLLECTIVE_TIMEOUT_VARIABLE
from scalingrun_api.models import MANAGED_BY, PodOverride, PodRole, ScalingRun, overrides_for
from scalingrun_api.status_push import STATUS_DIR, STATUS_PATH_VARIABLE
from scalingrun_api.models.training import CONFIG_PATH
from .findings import FieldError

# Label keys of the operator's (builders.common.labels), the Job controller's and mpi-operator's.
RESERVED_LABEL_PREFIXES = ("scalingrun.dev/", "training.kubeflow.org/", "batch.kubernetes.io/", "kueue.x-k8s.io/")
RESERVED_LABELS = frozenset({*MANAGED_BY, "app.kubernetes.io/name", "app.kubernetes.io/instance",
                             "app.kubernetes.io/component", "controller-uid", "job-name"})
RESERVED_ANNOTATION_PREFIXES = ("scalingrun.dev/",)
# Variables the operator sets (storage, tracking, the engines', the push path's), the image's paths (mpirun forwards
# them to every rank), the Job controller's and mpi-operator's.
RESERVED_ENV_PREFIXES = ("SCALINGRUN_",)
RESERVED_ENV = frozenset({
    "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
    "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING", COLLECTIVE_TIMEOUT_VARIABLE, STATUS_PATH_VARIABLE,
    "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "JOB_COMPLETION_INDEX", "K_MPI_JOB_ROLE",
    "OMPI_MCA_orte_keep_fqdn_hostnames", "OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_set_default_slots",
    *(e.thread_variable for e in ENGINES.values() if e.thread_variable),
    *(name for e in ENGINES.values() for name, _ in e.rank_env),
})
# The operator's volumes (builders: config, writable_dirs, shared_memory, status_volume) and mpi-operator's.
RESERVED_VOLUMES = frozenset({"config", "tmp", "home-mpiuser-sshd", "dev-shm", "scalingrun-status", "ssh-auth",
                              "mpi-job-config"})
# Where they are mounted: a mount there, or above (hiding it), is refused.
RESERVED_PATHS = (CONFIG_PATH.rsplit("/", 1)[0], "/tmp", "/home/mpiuser/.sshd", "/home/mpiuser/.ssh", "/dev/shm",
                  "/etc/mpi", STATUS_DIR)

# A label or annotation key: [prefix/]name, the prefix a DNS subdomain, the name up to 63 characters.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VOLUME_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
PODS = {PodRole.preprocess.value: "the preprocessing pods", PodRole.launcher.value: "the launcher pod",
        PodRole.workers.value: "the worker pods"}


def pod_override_errors(run: ScalingRun, allow_host_path: bool = False) -> list[FieldError]:
    """Every rule of spec.podOverrides, each error at the field it is about."""
    errors: list[FieldError] = []
    for index, override in enumerate(run.spec.pod_overrides):
        errors += _override_errors(f"spec.podOverrides[{index}]", override, allow_host_path)
    for role in PODS:
        errors += _role_errors(run, role)
    unique: dict[str, FieldError] = {}  # an override of several roles may break one rule for each
    for error in errors:
        unique.setdefault(str(error), error)
    return list(unique.values())


def _override_errors(path: str, override: PodOverride, allow_host_path: bool) -> list[FieldError]:
    errors = []
    if len(set(override.targets)) < len(override.targets):
        errors.append(FieldError(f"{path}.targets", "names a role twice: list each of preprocess, launcher, workers "
                                 "once"))
    for kind, keys, prefixes, exact in (("labels", override.metadata.labels, RESERVED_LABEL_PREFIXES, RESERVED_LABELS),
                                        ("annotations", override.metadata.annotations, RESERVED_ANNOTATION_PREFIXES,
                                         frozenset())):
        for key in keys:
            where = f"{path}.metadata.{kind}"
            if not _KEY.match(key) or len(key) > 317:
                errors.append(FieldError(where, f"{key!r} is not a valid key ([prefix/]name: the prefix a DNS "
                                         "subdomain, the name up to 63 letters, digits, '-', '_' or '.')"))
            elif key in exact or key.startswith(prefixes):
                errors.append(FieldError(where, f"{key} is set by the operator, the Job controller or mpi-operator "
                                         f"(reserved: {', '.join(prefixes)}{' and ' if exact else ''}"
                                         f"{', '.join(sorted(exact))}): choose another key"))
    for i, env in enumerate(override.env):
        where = f"{path}.env[{i}]"
        if not _ENV_NAME.match(env.name):
            errors.append(FieldError(f"{where}.name", f"{env.name!r} is not a valid variable name (letters, digits, "
                                     "'_', '-', '.'; not starting with a digit)"))
        elif env.name in RESERVED_ENV or env.name.startswith(RESERVED_ENV_PREFIXES):
            errors.append(FieldError(f"{where}.name", f"{env.name} is set by the operator or the image (reserved: "
                                     "SCALINGRUN_*, the storage, MLflow, engine and MPI variables, PATH): the "
                                     "run's spec says what it means; choose another name"))
        if env.value is not None and env.value_from is not None:
            errors.append(FieldError(where, "has both value and valueFrom: keep one"))
    for i, source in enumerate(override.env_from):
        if (source.config_map_ref is None) == (source.secret_ref is None):
            errors.append(FieldError(f"{path}.envFrom[{i}]", "needs exactly one of configMapRef and secretRef"))
    for i, volume in enumerate(override.volumes):
        errors += _volume_errors(f"{path}.volumes[{i}]", volume, allow_host_path)
    for i, mount in enumerate(override.volume_mounts):
        clean = "/" + mount.mount_path.strip("/")
        hidden = [p for p in RESERVED_PATHS if p == clean or p.startswith(clean.rstrip("/") + "/")]
        if hidden:
            errors.append(FieldError(f"{path}.volumeMounts[{i}].mountPath", f"{mount.mount_path} would hide the "
                                     f"operator's mount at {hidden[0]} (reserved: {', '.join(RESERVED_PATHS)}): "
                                     "choose another path"))
    return errors


def _volume_errors(path: str, volume: dict[str, Any], allow_host_path: bool) -> list[FieldError]:
    name = volume.get("name")
    sources = [key for key in volume if key != "name"]
    if not isinstance(name, str) or not _VOLUME_NAME.match(name):
        return [FieldError(f"{path}.name", "required: a DNS label (lowercase letters, digits and '-', up to 63), "
                           f"got {name!r}")]
    if name in RESERVED_VOLUMES:
        return [FieldError(f"{path}.name", f"{name} is a volume of the operator's or mpi-operator's (reserved: "
                           f"{', '.join(sorted(RESERVED_VOLUMES))}): choose another name")]
    if len(sources) != 1 or not isinstance(volume[sources[0]], dict):
        return [FieldError(path, f"needs exactly one source object beside its name (emptyDir, persistentVolumeClaim, "
                           f"configMap, ...), got {', '.join(sources) or 'none'}")]
    if sources[0] == "hostPath" and not allow_host_path:
        return [FieldError(f"{path}.hostPath", "a node's own files are refused (they outlive the pod and reach "
                           "beyond it): use a persistentVolumeClaim or emptyDir, or ask the operator's admin for "
                           "runs.allowHostPath (then validate with --allow-host-path)")]
    return []


def _role_errors(run: ScalingRun, role: str) -> list[FieldError]:
    """What the overrides of one role's pods give twice, or what no override of them gives (a mount's volume)."""
    errors: list[FieldError] = []
    pods = PODS[role]
    firsts: dict[tuple[str, str], tuple[str, Any]] = {}
    if role == PodRole.workers.value:
        workers = run.spec.workers
        for key, value in workers.node_selector.items():
            firsts[("nodeSelector", key)] = ("spec.workers.nodeSelector", value)
        if workers.priority_class_name:
            firsts[("priorityClassName", "")] = ("spec.workers.priorityClassName", workers.priority_class_name)
    volumes: set[str] = set()
    for index, override in overrides_for(run.spec.pod_overrides, role):
        path = f"spec.podOverrides[{index}]"
        entries = [("labels", "metadata.labels", k, v) for k, v in override.metadata.labels.items()]
        entries += [("annotations", "metadata.annotations", k, v) for k, v in override.metadata.annotations.items()]
        entries += [("env", f"env[{i}].name", e.name, None) for i, e in enumerate(override.env)]
        entries += [("volumes", f"volumes[{i}].name", v.get("name"), None) for i, v in enumerate(override.volumes)]
        entries += [("volumeMounts", f"volumeMounts[{i}].mountPath", "/" + m.mount_path.strip("/"), None)
                    for i, m in enumerate(override.volume_mounts)]
        entries += [("nodeSelector", "nodeSelector", k, v) for k, v in override.node_selector.items()]
        entries += [("affinity", "affinity", "", None)] if override.affinity is not None else []
        entries += ([("priorityClassName", "priorityClassName", "", override.priority_class_name)]
                    if override.priority_class_name else [])
        for kind, field, key, value in entries:
            first = firsts.setdefault((kind, str(key)), (f"{path}.{field}", value))
            if first[0] != f"{path}.{field}" and (value is None or first[1] != value):
                errors.append(_twice(f"{path}.{field}", key, first[0], pods))
        volumes.update(str(v.get("name")) for v in override.volumes)
    for index, override in overrides_for(run.spec.pod_overrides, role):
        for i, mount in enumerate(override.volume_mounts):
            if mount.name not in volumes:
                errors.append(FieldError(f"spec.podOverrides[{index}].volumeMounts[{i}].name", f"{mount.name} is no "
                                         f"volume of {pods}: add it to the volumes of an override whose targets "
                                         f"include {role}"))
    return errors


def _twice(path: str, key: Optional[str], first: str, pods: str) -> FieldError:
    what = f"{key} " if key else ""
    return FieldError(path, f"{what}is given to {pods} by {first} already: say it once (an override does not "
                      "replace another)")
