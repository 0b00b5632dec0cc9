"""The trainer's config (config.json, rendered by the operator) parsed with the API's own models
(scalingrun_api.config.TrainerConfig): every default is the spec's, written once, there. And which engine trains."""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

from scalingrun_api.config import TrainerConfig
from scalingrun_api.engines import ENGINES as ENGINE_ROWS
from scalingrun_api.models import Training

# (training.framework, training.strategy) -> the module whose train(config) runs it.
ENGINES = {pair: row.trainer_module for pair, row in ENGINE_ROWS.items()}


def read_document(path: Optional[str]) -> dict[str, Any]:
    """The JSON object in `path` ("-": stdin); {} without a path."""
    if not path:
        return {}
    with (sys.stdin if path == "-" else open(path)) as f:
        return json.load(f)


def parse_config(document: dict[str, Any]) -> TrainerConfig:
    return TrainerConfig.model_validate(document)


def engine_of(document: dict[str, Any]) -> tuple[str, str]:
    """(framework, strategy) of a config, defaults resolved by the API model; read before the whole config is
    parsed, to pick the engine (whose image may lack the other engines' stacks)."""
    training = document.get("training") or {}
    chosen = Training.model_validate({key: training[key] for key in ("framework", "strategy") if key in training})
    return chosen.framework, chosen.strategy
