"""The trainer's config document, `config.json`: the parts of a ScalingRun's spec that the preprocessing Job and
the trainers need, with derived values resolved. The operator renders it (scalingrun_operator.builders.config)
into a ConfigMap; the containers parse it with this model, so every default is the spec's own."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from .models.common import ApiModel
from .models.run import Dataset, Storage, Tracking
from .models.training import Model, Training

CONFIG_FILE_NAME = "config.json"
# What the containers must not see: Secret names stay with the operator (keys come in as environment variables).
_SECRET_FIELDS = {"storage": {"credentials_secret", "access_key_id_key", "secret_access_key_key"},
                  "tracking": {"credentials_secret"}}


class TrainerConfig(ApiModel):
    """config.json."""

    run: str = Field(..., min_length=1, description="The ScalingRun's name (MLflow's run name).")
    processes: int = Field(..., ge=1, description="Training processes (mpirun -np).")
    run_location: str = Field(..., min_length=1, description="Where checkpoints, progress and the model go.")
    storage: Storage = Field(default_factory=Storage, description="Endpoint and region (no Secret names).")
    dataset: Dataset
    model: Model = Field(default_factory=Model)
    training: Training = Field(default_factory=Training)
    tracking: Optional[Tracking] = None

    def document(self) -> dict[str, Any]:
        """The JSON object the operator writes."""
        return self.model_dump(mode="json", by_alias=True, exclude=_SECRET_FIELDS)
