"""What a run adds to its pods: tolerations, and spec.podOverrides (labels, annotations, volumes, env, placement) per
role. Kubernetes' own large objects (a volume, affinity, a topology spread constraint) stay free-form here and in the
CRD; the operator's validation (schema/pod_overrides.py) checks what it owns in them."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Optional

from pydantic import ConfigDict, Field, WithJsonSchema

from .common import DNS_SUBDOMAIN_PATTERN, LABEL_VALUE_PATTERN, MAX_INTEGER, SECRET_NAME_PATTERN, ApiModel


class TolerationOperator(str, Enum):
    exists = "Exists"
    equal = "Equal"


class TaintEffect(str, Enum):
    no_schedule = "NoSchedule"
    prefer_no_schedule = "PreferNoSchedule"
    no_execute = "NoExecute"


class Toleration(ApiModel):
    """A pod toleration, as in the Pod API. Frozen: the operator's default GPU tolerations are shared constants."""

    model_config = ConfigDict(**ApiModel.model_config, frozen=True)

    key: Optional[str] = Field(None, description="Taint key; empty with Exists matches all taints.")
    operator: TolerationOperator = Field(TolerationOperator.equal, description="Exists or Equal.")
    value: Optional[str] = Field(None, description="Taint value for Equal.", pattern=LABEL_VALUE_PATTERN, max_length=63)
    effect: Optional[TaintEffect] = Field(None, description="Taint effect to match; empty matches all.")
    toleration_seconds: Optional[int] = Field(
        None, ge=0, le=MAX_INTEGER, description="For NoExecute: how long to stay bound.")


class PodRole(str, Enum):
    """The pods of a run an override applies to."""

    preprocess = "preprocess"
    launcher = "launcher"
    workers = "workers"


# A Kubernetes object given as the Pod API writes it (a volume, affinity, a topology spread constraint): the API
# server keeps it as it is, the operator's validation checks what it owns in it.
KubernetesObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]

# The same as a list's item, which kubectl explain describes too.
Volume = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "x-kubernetes-preserve-unknown-fields": True,
    "description": "A volume, as in the Pod API: its name and one source."})]
TopologySpreadConstraint = Annotated[dict[str, Any], WithJsonSchema({
    "type": "object", "x-kubernetes-preserve-unknown-fields": True,
    "description": "A topology spread constraint, as in the Pod API."})]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


class PodMetadata(ApiModel):
    """Labels and annotations added to the pods (Istio, Karpenter, cost allocation)."""

    labels: dict[str, LabelValue] = Field(default_factory=dict, description="Labels of the pods; not the operator's "
                                          "own (scalingrun.dev/, app.kubernetes.io/name, instance, component, "
                                          "managed-by) nor those of the Job controller and mpi-operator.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the pods; not "
                                        "scalingrun.dev/ ones.")


class VolumeMount(ApiModel):
    """A volume of the override mounted in the pod's main container."""

    name: str = Field(..., description="One of the volumes of an override for the same pods.", max_length=63)
    mount_path: str = Field(..., description="Absolute path in the container; not one the operator mounts (or "
                            "above one).", pattern=r"^/", max_length=4096)
    read_only: Optional[bool] = Field(None, description="Mount it read-only.")
    sub_path: Optional[str] = Field(None, description="A path inside the volume to mount instead of its root.",
                                    max_length=4096)


class EnvVar(ApiModel):
    """An environment variable of the main container: a value, or valueFrom (a ConfigMap or Secret key, a field)."""

    name: str = Field(..., description="Not a name the operator sets (SCALINGRUN_*, AWS_*, MLFLOW_*, the engines' "
                      "and MPI's).", max_length=256)
    value: Optional[str] = Field(None, description="The value.")
    value_from: Optional[KubernetesObject] = Field(None, description="As in the Pod API: configMapKeyRef, "
                                                   "secretKeyRef, fieldRef or resourceFieldRef.")


class SourceRef(ApiModel):
    name: str = Field(..., description="Name of the ConfigMap or Secret in the run's namespace.",
                      pattern=SECRET_NAME_PATTERN, max_length=253)
    optional: Optional[bool] = Field(None, description="Start the pod even when it does not exist.")


class EnvFromSource(ApiModel):
    """Every key of a ConfigMap or Secret as a variable. The operator's own variables take precedence over these."""

    prefix: Optional[str] = Field(None, description="Put before every key's name.", max_length=256)
    config_map_ref: Optional[SourceRef] = Field(None, description="A ConfigMap.")
    secret_ref: Optional[SourceRef] = Field(None, description="A Secret.")


class PodOverride(ApiModel):
    """Additions to the pods of the targets (the launcher, the workers, the preprocessing Job's). Several overrides
    for the same pods add up; the same key, variable, volume or path twice is refused, not silently replaced."""

    targets: list[PodRole] = Field(..., min_length=1, max_length=3, description="The pods this applies to: "
                                   "preprocess, launcher, workers.")
    metadata: PodMetadata = Field(default_factory=PodMetadata, description="Labels and annotations.")
    volumes: list[Volume] = Field(
        default_factory=list, max_length=64, description="Volumes, as in the Pod API (emptyDir, persistentVolumeClaim, "
        "configMap, secret, csi, nfs, ...): a name that is not the operator's; hostPath only where the operator "
        "allows it.")
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=64, description="Mounts of these "
                                             "volumes in the main container.")
    env: list[EnvVar] = Field(default_factory=list, max_length=256, description="Variables of the main container.")
    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=64, description="ConfigMaps and Secrets "
                                          "whose keys become variables of the main container.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods must have (for "
                                          "the workers, beside spec.workers.nodeSelector).")
    affinity: Optional[KubernetesObject] = Field(None, description="Node and pod (anti-)affinity, as in the Pod API; "
                                                 "one override per pod at most.")
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64, description="Tolerations (for the "
                                          "workers, beside spec.workers.tolerations).")
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=16, description="Topology spread constraints, as in the Pod API.")
    priority_class_name: Optional[str] = Field(
        None, description="PriorityClass of the pods (the workers' is spec.workers.priorityClassName).",
        pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)


def overrides_for(overrides: list[PodOverride], role: str) -> list[tuple[int, PodOverride]]:
    """(index, override) of the overrides that apply to ROLE's pods, in order."""
    return [(index, override) for index, override in enumerate(overrides) if role in override.targets]
