"""The model repository: folder layout, version policies and model configuration
(Triton's ``config.pbtxt`` fields, written as ``config.yaml``)."""

from __future__ import annotations

from frameserve.repository._config import BACKENDS, PRECISIONS, InstanceGroup, ModelConfig, parse_config
from frameserve.repository._policy import VersionPolicy
from frameserve.repository._repository import MODEL_FILENAMES, ModelRepository
from frameserve.repository._schema import config_schema, validate_config

__all__ = [
    "BACKENDS",
    "MODEL_FILENAMES",
    "PRECISIONS",
    "InstanceGroup",
    "ModelConfig",
    "ModelRepository",
    "VersionPolicy",
    "config_schema",
    "parse_config",
    "validate_config",
]
