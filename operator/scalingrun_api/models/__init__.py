"""The ScalingRun and ScalingSweep API (`scalingrun.dev/v1alpha1`): the single source of truth.

The CRDs in manifests/ and in the chart are generated from these models (`scalingrun crd`); field descriptions
become `kubectl explain` text. One module per part of the resource; this package names them all.
"""

from .common import (
    API_VERSION, AUTO, CATEGORIES, DATA_URI_PATTERN, DEFAULT_LIGHTNING_TRAINER_IMAGE, DEFAULT_TRAINER_IMAGE,
    DIGEST_PATTERN, DNS_SUBDOMAIN_PATTERN, GROUP, HTTP_URL_PATTERN, IMAGE_REFERENCE_PATTERN, INT64_MAX, KIND,
    LABEL_VALUE_PATTERN, MANAGED_BY, MANAGED_SELECTOR, MPIJOB_API_VERSION, MPIJOB_GROUP, MPIJOB_PLURAL, MPIJOB_VERSION,
    MAX_BATCH_SIZE, MAX_INTEGER,
    PLURAL, QUANTITY_PATTERN, SECRET_NAME_PATTERN, SHORT_NAMES, SINGULAR, VERSION, WEIGHTS_PATTERN, ApiModel,
    BatchSize, Duration, DurationOrAuto, ObjectMeta, Quantity, duration_seconds, quantity_value, secret_name_field,
)
from .dataset import Columns, Dataset, DatasetFormat, Preprocessing, Resources
from .model import BUILDER_PATTERN, BUILTIN_DEFAULTS, BaseNetwork, Model
from .pods import EnvFromSource, EnvVar, PodMetadata, PodOverride, PodRole, VolumeMount, overrides_for
from .run import (
    CleanPodPolicy, Launcher, LauncherResources, RunPolicy, ScalingRun, ScalingRunSpec, SchedulingPolicy, Storage,
    StorageCredentials, TaintEffect, Toleration, TolerationOperator, Tracking, Workers,
)
from .status import (
    BatchSizeProbe, CapacitySeen, Condition, DeviceKind, Devices, ElasticStatus, FeatureCache, InputEpoch, Phase,
    PreprocessingStatus, ProbedBatchSize, Resize, ScalingRunStatus, SizeCounting, SizeTime, TrainingPod,
    TrainingStatus,
)
from .sweep import (
    SWEEP_KIND, SWEEP_PLURAL, SWEEP_SHORT_NAMES, SWEEP_SINGULAR, ScalingSweep, ScalingSweepSpec, ScalingSweepStatus,
    SweepPhase, SweepPoint, SweepRecommendation,
)
from .training import (
    FRAMEWORK_STRATEGIES, Checkpoint, EarlyStopping, FeatureCacheMode, Framework, InputPipeline, LearningRateScaling,
    Monitor, OnStall, Optimizer, Strategy, Training,
)

