"""Typed configuration: dataclasses that validate themselves, strict TOML loading, dotted overrides, presets.

- ``lmforge.config.base``: ``from_dict`` / ``to_dict`` (strict: an unknown key lists the valid ones), TOML, overrides.
- ``lmforge.config.model``: ``ModelConfig``, the shape every model family shares, and the family registry.
- ``lmforge.config.families``: one config class per model family (``EncoderConfig``, ``DecoderConfig`` ...), each
  with its presets; ``ModelConfig(arch=...)`` and ``from_dict(ModelConfig, ...)`` build the family's class.
- ``lmforge.config.run``: ``TrainConfig``, ``DataConfig``, ``TaskConfig``.

Every run and every checkpoint stores its resolved configuration as plain JSON (``to_dict``) and reads it back
strictly (``from_dict``). Presets are partial overrides of their family's defaults; code never branches on a preset's
name.
"""

from lmforge.config.base import (
    apply_overrides,
    coerce,
    from_dict,
    load_toml,
    parse_override,
    to_dict,
    toml_literal,
)
from lmforge.config.families import (
    PRESETS,
    AWDLSTMConfig,
    BiLMConfig,
    DecoderConfig,
    EncoderConfig,
    RNNConfig,
    RNNSeq2SeqConfig,
    Seq2SeqConfig,
    XLNetConfig,
    model_config_from_preset,
)
from lmforge.config.model import (
    MAX_SIZE,
    ModelConfig,
    core_fields,
    family_class,
    family_classes,
    upgrade_model_values,
)
from lmforge.config.run import (
    BUDGET_FORMS,
    DEFAULT_SAVE_EVERY,
    DEFAULT_SAVE_MINUTES,
    SCHEMES,
    Budget,
    DataConfig,
    TaskConfig,
    TrainConfig,
    parse_budget,
)

__all__ = [
    "BUDGET_FORMS", "DEFAULT_SAVE_EVERY", "DEFAULT_SAVE_MINUTES", "MAX_SIZE", "PRESETS", "SCHEMES", "AWDLSTMConfig",
    "BiLMConfig", "Budget",
    "DataConfig", "DecoderConfig", "EncoderConfig", "ModelConfig", "RNNConfig", "RNNSeq2SeqConfig", "Seq2SeqConfig",
    "TaskConfig", "TrainConfig", "XLNetConfig", "apply_overrides", "coerce", "core_fields", "family_class",
    "family_classes", "from_dict", "load_toml", "model_config_from_preset", "parse_budget", "parse_override", "to_dict",
    "toml_literal", "upgrade_model_values",
]
