"""One readable file per model family: ``Encoder`` (BERT), ``Decoder`` (GPT), ``EncoderDecoder`` (Transformer),
``RNNEncoder`` (BiRNN + attention pooling) and ``RNNSeq2Seq`` (attentional RNN encoder-decoder).

Imports are lazy so that importing one family never imports the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Encoder": "lmforge.models.encoder",
    "EncoderOutput": "lmforge.models.encoder",
    "Decoder": "lmforge.models.decoder",
    "DecoderOutput": "lmforge.models.decoder",
    "EncoderDecoder": "lmforge.models.seq2seq",
    "RNNEncoder": "lmforge.models.rnn_encoder",
    "RNNSeq2Seq": "lmforge.models.rnn_seq2seq",
    "save_pretrained": "lmforge.models.pretrained",
    "load_pretrained": "lmforge.models.pretrained",
    "load_backbone": "lmforge.models.pretrained",
}

# config.arch -> class name
_ARCH_CLASSES = {"encoder": "Encoder", "decoder": "Decoder", "seq2seq": "EncoderDecoder", "rnn": "RNNEncoder",
                 "rnn_seq2seq": "RNNSeq2Seq"}


class _Architectures:
    """``ARCHITECTURES[arch]`` -> the model class (imported on first use)."""

    def __getitem__(self, arch: str) -> type:
        if arch not in _ARCH_CLASSES:
            from lmforge.errors import LmforgeError

            raise LmforgeError(f"unknown architecture {arch!r}; choose one of {', '.join(_ARCH_CLASSES)}")
        return __getattr__(_ARCH_CLASSES[arch])

    def __iter__(self):
        return iter(_ARCH_CLASSES)


ARCHITECTURES = _Architectures()


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'lmforge.models' has no attribute {name!r}")


__all__ = ["ARCHITECTURES", *_WHERE]
