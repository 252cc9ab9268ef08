"""The model repository: folder layout, version policies and model configuration
(Triton's ``config.pbtxt`` fields, written as ``config.yaml``)."""

from __future__ import annotations

from frameserve.repository._config import (
    BACKENDS,
    ENSEMBLE,
    PRECISIONS,
    InstanceGroup,
    ModelConfig,
    RateLimiterSpec,
    check_model_filename,
    parse_config,
)
from frameserve.repository._ensemble import EnsembleScheduling, EnsembleStep, check_ensemble_graph
from frameserve.repository._inputs import InputSignature, check_inputs
from frameserve.repository._override import config_override
from frameserve.repository._policy import VersionPolicy
from frameserve.repository._repository import MAX_MODEL_NAME_BYTES, MODEL_FILENAMES, ModelRepository, check_model_name
from frameserve.repository._schema import config_schema, validate_config
from frameserve.repository._sequence import (
    CONTROL_KINDS,
    SequenceBatching,
    SequenceControl,
    SequenceState,
    parse_sequence_batching,
)

__all__ = [
    "BACKENDS",
    "CONTROL_KINDS",
    "ENSEMBLE",
    "MAX_MODEL_NAME_BYTES",
    "MODEL_FILENAMES",
    "PRECISIONS",
    "EnsembleScheduling",
    "EnsembleStep",
    "InputSignature",
    "InstanceGroup",
    "ModelConfig",
    "ModelRepository",
    "RateLimiterSpec",
    "SequenceBatching",
    "SequenceControl",
    "SequenceState",
    "VersionPolicy",
    "check_ensemble_graph",
    "check_inputs",
    "check_model_filename",
    "check_model_name",
    "config_override",
    "config_schema",
    "parse_config",
    "parse_sequence_batching",
    "validate_config",
]
