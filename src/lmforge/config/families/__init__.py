"""One config class per model family, each with its presets: importing this package registers every family with
``lmforge.config.model`` (``ModelConfig(arch=...)`` and ``from_dict`` then find it)."""

from __future__ import annotations

from typing import Any

from lmforge.config.base import from_dict
from lmforge.config.families.awd_lstm import PRESETS as _AWD_LSTM
from lmforge.config.families.awd_lstm import AWDLSTMConfig
from lmforge.config.families.bilm import PRESETS as _BILM
from lmforge.config.families.bilm import BiLMConfig
from lmforge.config.families.decoder import PRESETS as _DECODER
from lmforge.config.families.decoder import DecoderConfig
from lmforge.config.families.encoder import PRESETS as _ENCODER
from lmforge.config.families.encoder import EncoderConfig
from lmforge.config.families.rnn import PRESETS as _RNN
from lmforge.config.families.rnn import RNNConfig, RNNSeq2SeqConfig
from lmforge.config.families.seq2seq import PRESETS as _SEQ2SEQ
from lmforge.config.families.seq2seq import Seq2SeqConfig
from lmforge.config.families.xlnet import PRESETS as _XLNET
from lmforge.config.families.xlnet import XLNetConfig
from lmforge.config.model import ModelConfig
from lmforge.errors import LmforgeError

# Every named preset: a partial override of its family's defaults (``arch`` included). Code never branches on a
# preset's name.
PRESETS: dict[str, dict[str, Any]] = {**_ENCODER, **_DECODER, **_SEQ2SEQ, **_RNN, **_AWD_LSTM, **_BILM, **_XLNET}



def model_config_from_preset(name: str, **overrides: Any) -> ModelConfig:
    """A ``ModelConfig`` (its family's class) from a named preset, with keyword overrides (e.g. ``vocab_size``)."""
    if name not in PRESETS:
        raise LmforgeError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    values = {**PRESETS[name], **overrides}
    return from_dict(ModelConfig, values, where=f"preset {name!r}")


__all__ = ["PRESETS", "AWDLSTMConfig", "BiLMConfig", "DecoderConfig", "EncoderConfig", "RNNConfig",
           "RNNSeq2SeqConfig", "Seq2SeqConfig", "XLNetConfig", "model_config_from_preset"]
