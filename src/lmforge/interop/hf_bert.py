"""Hugging Face BERT checkpoints <-> lmforge ``Encoder`` and ``BertPreTrainingHeads``.

The only module where Hugging Face's BERT names appear. Layouts handled (names checked against
transformers' ``BertModel`` / ``BertForPreTraining`` / ``BertForMaskedLM`` state dicts):

- ``BertModel``: ``embeddings.word_embeddings.weight``, ``encoder.layer.{i}.attention.self.query.weight``, ...,
  ``pooler.dense.*`` (no prefix).
- ``BertForPreTraining`` / ``BertForMaskedLM``: the same under ``bert.``, plus ``cls.predictions.*`` (MLM) and,
  for pretraining, ``cls.seq_relationship.*`` (NSP). ``BertForMaskedLM`` has no pooler and no NSP head.

Google's original TF-converted checkpoints call LayerNorm parameters ``gamma`` / ``beta``; both spellings load.
Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmforge.config import ModelConfig, coerce
from lmforge.errors import LmforgeError

__all__ = ["config_from_hf", "config_to_hf", "encoder_export_problems", "is_hf_bert_dir", "state_dict_from_hf",
           "state_dict_to_hf"]

# HF hidden_act -> our activation name. "gelu_new", "gelu_pytorch_tanh" and "gelu_fast" are all the tanh
# approximation (the first two exactly; gelu_fast rearranges the same formula).
_ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
                "relu": "relu", "quick_gelu": "gelu_sigmoid"}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "gelu_sigmoid": "quick_gelu"}

# Ours <-> HF, relative to the encoder ("bert." is added for the task layouts). {i} = layer index.
_EMBEDDINGS = {
    "embeddings.tokens.weight": "embeddings.word_embeddings.weight",
    "embeddings.positions.weight": "embeddings.position_embeddings.weight",
    "embeddings.segments.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    "pooler.dense.weight": "pooler.dense.weight",
    "pooler.dense.bias": "pooler.dense.bias",
}
_LAYER = {
    "self_attn.q_proj": "attention.self.query",
    "self_attn.k_proj": "attention.self.key",
    "self_attn.v_proj": "attention.self.value",
    "self_attn.out_proj": "attention.output.dense",
    "self_attn_norm": "attention.output.LayerNorm",
    "ffn.fc1": "intermediate.dense",
    "ffn.fc2": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
_HEADS = {
    "mlm.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm.bias": "cls.predictions.bias",
    "nsp.classifier.weight": "cls.seq_relationship.weight",
    "nsp.classifier.bias": "cls.seq_relationship.bias",
}
# Copies of other entries in HF's state dicts: the decoder weight is the tied word embedding, the decoder bias
# is cls.predictions.bias. Checked for consistency on import, written on export when asked.
_TIED_DECODER_WEIGHT = "cls.predictions.decoder.weight"
_TIED_DECODER_BIAS = "cls.predictions.decoder.bias"
# Buffers that some checkpoints carry and that carry no weights.
_IGNORED = {"embeddings.position_ids", "embeddings.token_type_ids"}

_HF_LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
_FROM_HF_EMBEDDINGS = {hf: ours for ours, hf in _EMBEDDINGS.items()}
_FROM_HF_LAYER = {hf: ours for ours, hf in _LAYER.items()}
_FROM_HF_HEADS = {hf: ours for ours, hf in _HEADS.items()}


# ---------------------------------------------------------------------------------------------- configs
def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face BERT ``config.json`` dict.

    Args:
        hf: the parsed config (``model_type`` "bert" if present, ``position_embedding_type`` "absolute").

    Returns:
        An encoder ``ModelConfig`` (post-LN, learned positions, tied embeddings).

    Raises:
        LmforgeError: a setting our encoder cannot reproduce (names the key, the value and what is supported).
    """
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise LmforgeError(f"config model_type={model_type!r} is not a BERT checkpoint (expected 'bert')")
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise LmforgeError(f"position_embedding_type={position_type!r} is not supported; only 'absolute' (learned) "
                           "positions can be imported")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise LmforgeError("this BERT config is a decoder (is_decoder / add_cross_attention); only the "
                           "bidirectional encoder can be imported")
    act = hf.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _ACT_FROM_HF:
        raise LmforgeError(f"hidden_act={act!r} is not supported; choose one of {', '.join(_ACT_FROM_HF)}")
    if not hf.get("tie_word_embeddings", True):
        raise LmforgeError("tie_word_embeddings=false: untied MLM decoders are not supported")
    missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers") if k not in hf]
    if missing:
        raise LmforgeError(f"BERT config lacks {', '.join(missing)}")

    def get(key: str, default: Any, kind: Any = int) -> Any:  # checked before any arithmetic on the value
        return coerce(hf.get(key, default), kind, key)

    hidden = get("hidden_size", None)
    return ModelConfig(
        arch="encoder",
        vocab_size=get("vocab_size", None),
        d_model=hidden,
        n_heads=get("num_attention_heads", None),
        n_layers=get("num_hidden_layers", None),
        d_ff=get("intermediate_size", 4 * hidden),
        max_seq_len=get("max_position_embeddings", 512),
        dropout=get("hidden_dropout_prob", 0.1, float),
        attention_dropout=get("attention_probs_dropout_prob", 0.1, float),
        activation=_ACT_FROM_HF[act],
        norm_first=False,
        layer_norm_eps=get("layer_norm_eps", 1e-12, float),
        positional="learned",
        type_vocab_size=get("type_vocab_size", 2),
        tie_embeddings=True,
        pad_token_id=get("pad_token_id", None, int | None) or 0,
        init_std=get("initializer_range", 0.02, float),
    )


def config_to_hf(config: ModelConfig, architecture: str = "BertForPreTraining") -> dict[str, Any]:
    """A Hugging Face ``BertConfig`` dict (``config.json``) for ``config``.

    Args:
        config: an encoder config that BERT can express: post-LN, learned positions, tied embeddings.
        architecture: the ``architectures`` entry ("BertForPreTraining" with heads, "BertModel" without).

    Raises:
        LmforgeError: the config uses something HF's BERT does not have (names it).
    """
    problems = encoder_export_problems(config, "BERT", check_arch=False)
    if problems:
        raise LmforgeError("cannot express this model as a Hugging Face BERT: " + "; ".join(problems))
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": _ACT_TO_HF[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_seq_len,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def encoder_export_problems(config: ModelConfig, layout: str, *, check_arch: bool = True) -> list[str]:
    """What every Hugging Face BERT-family layout (BERT, ALBERT, DistilBERT) needs of an encoder config and
    ``config`` lacks: an encoder, post-LN, learned absolute positions, an activation HF names, tied embeddings. Each
    layout adds its own checks (segments, pooler, sharing) to the list."""
    problems = []
    if check_arch and config.arch != "encoder":
        problems.append(f"arch={config.arch!r} ({layout} is an encoder)")
    if config.norm_first:
        problems.append(f"norm_first=True (HF {layout} is post-LN)")
    if config.positional != "learned":
        problems.append(f"positional={config.positional!r} (HF {layout} has learned absolute positions)")
    if config.activation not in _ACT_TO_HF:
        problems.append(f"activation={config.activation!r}")
    if not config.tie_embeddings:
        problems.append("tie_embeddings=False")
    return problems


def refuse_unexpected(unexpected: list[str], layout: str, expected: str) -> None:
    """Raise naming up to ten keys a ``layout`` state dict should not have (nothing when there are none)."""
    if unexpected:
        shown = ", ".join(repr(k) for k in unexpected[:10]) + (" ..." if len(unexpected) > 10 else "")
        raise LmforgeError(f"unexpected key(s) in the {layout} state dict: {shown}; expected {expected} checkpoint")


def check_tied_decoder(tokens: Tensor | None, decoder_weight: Tensor, name: str) -> None:
    """Refuse a checkpoint whose MLM decoder weight ``name`` is not a copy of the word embedding ``tokens``."""
    if tokens is None or tokens.shape != decoder_weight.shape or not torch.equal(tokens, decoder_weight):
        raise LmforgeError(f"{name!r} differs from the word embedding: the checkpoint's MLM decoder is untied, which "
                           "is not supported")


def is_hf_bert_dir(path: str | Path) -> bool:
    """True if ``path`` is a folder with a ``config.json`` whose ``model_type`` is "bert"."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("model_type") == "bert"


# ---------------------------------------------------------------------------------------------- state dicts
def _hf_layernorm_name(key: str) -> str:
    # Google's TF-converted checkpoints: LayerNorm.gamma / LayerNorm.beta.
    if key.endswith("LayerNorm.gamma"):
        return key[: -len("gamma")] + "weight"
    if key.endswith("LayerNorm.beta"):
        return key[: -len("beta")] + "bias"
    return key


def _encoder_key_from_hf(key: str) -> str | None:
    if key in _FROM_HF_EMBEDDINGS:
        return _FROM_HF_EMBEDDINGS[key]
    m = _HF_LAYER_KEY.fullmatch(key)
    if m and m.group(2) in _FROM_HF_LAYER:
        return f"layers.{m.group(1)}.{_FROM_HF_LAYER[m.group(2)]}.{m.group(3)}"
    return None


def state_dict_from_hf(hf_sd: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """Rename a Hugging Face BERT state dict to ours.

    Args:
        hf_sd: a ``BertModel`` state dict (no prefix), or a ``BertForPreTraining`` / ``BertForMaskedLM`` one
            (``bert.`` prefix and ``cls.*`` heads). Known buffers (``embeddings.position_ids``) are skipped.

    Returns:
        ``(encoder_sd, heads_sd)``: the ``Encoder`` state dict, and the ``BertPreTrainingHeads`` state dict or None
        when the checkpoint has no heads. Tensors are shared, not copied. Modules a layout lacks are absent
        (``BertForMaskedLM``: no ``pooler.*`` and no ``nsp.*``), so load those with ``strict=False`` and check
        that only they are missing.

    Raises:
        LmforgeError: an unexpected key (named), or a decoder weight that is not the word embedding (untied).
    """
    keys = [k for k in hf_sd if not k.startswith("cls.")]
    prefixed = bool(keys) and all(k.startswith("bert.") for k in keys)
    encoder_sd: dict[str, Tensor] = {}
    heads_sd: dict[str, Tensor] = {}
    decoder_weight = decoder_bias = None
    unexpected = []
    for raw_key, value in hf_sd.items():
        key = _hf_layernorm_name(raw_key)
        if key.startswith("cls."):
            if key == _TIED_DECODER_WEIGHT:
                decoder_weight = value
            elif key == _TIED_DECODER_BIAS:
                decoder_bias = value
            elif key in _FROM_HF_HEADS:
                heads_sd[_FROM_HF_HEADS[key]] = value
            else:
                unexpected.append(raw_key)
            continue
        if prefixed:
            key = key[len("bert."):]
        if key in _IGNORED:
            continue
        ours = _encoder_key_from_hf(key)
        if ours is None:
            unexpected.append(raw_key)
        else:
            encoder_sd[ours] = value
    refuse_unexpected(unexpected, "BERT", "a BertModel, BertForPreTraining or BertForMaskedLM")
    if decoder_bias is not None:
        heads_sd.setdefault("mlm.bias", decoder_bias)
    if decoder_weight is not None:
        check_tied_decoder(encoder_sd.get("embeddings.tokens.weight"), decoder_weight, _TIED_DECODER_WEIGHT)
    return encoder_sd, (heads_sd or None)


def state_dict_to_hf(encoder_sd: Mapping[str, Tensor], heads_sd: Mapping[str, Tensor] | None = None, *,
                     include_tied: bool = True) -> dict[str, Tensor]:
    """Rename our state dicts to a Hugging Face BERT state dict.

    Args:
        encoder_sd: an ``Encoder`` state dict (post-LN, learned positions).
        heads_sd: a ``BertPreTrainingHeads`` state dict, or None.
        include_tied: with heads, also write ``cls.predictions.decoder.weight`` (= the word embedding) and
            ``cls.predictions.decoder.bias`` (= ``cls.predictions.bias``), as ``BertForPreTraining.state_dict()``
            has them, so ``load_state_dict(strict=True)`` works. These entries share memory with others; pass
            False before ``safetensors.torch.save_file`` (transformers re-ties them on ``from_pretrained``).

    Returns:
        ``BertModel`` layout without heads; ``BertForPreTraining`` layout (``bert.`` prefix, ``cls.*``) with them.

    Raises:
        LmforgeError: a key with no BERT counterpart (e.g. ``final_norm.*`` of a pre-LN model), named.
    """
    prefix = "" if heads_sd is None else "bert."
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in encoder_sd.items():
        hf_key = _EMBEDDINGS.get(key)
        parts = key.split(".", 2)
        if hf_key is None and len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
            module, _, leaf = parts[2].rpartition(".")
            if module in _LAYER and leaf in ("weight", "bias"):
                hf_key = f"encoder.layer.{parts[1]}.{_LAYER[module]}.{leaf}"
        if hf_key is None:
            unknown.append(key)
        else:
            out[prefix + hf_key] = value
    for key, value in (heads_sd or {}).items():
        if key in _HEADS:
            out[_HEADS[key]] = value
        else:
            unknown.append(key)
    if unknown:
        raise LmforgeError(f"no Hugging Face BERT name for key(s) {', '.join(map(repr, unknown))}; only a post-LN "
                           "encoder with learned positions and BertPreTrainingHeads can be exported")
    if heads_sd is not None and include_tied:
        out[_TIED_DECODER_WEIGHT] = out[prefix + _EMBEDDINGS["embeddings.tokens.weight"]]
        if _HEADS["mlm.bias"] in out:
            out[_TIED_DECODER_BIAS] = out[_HEADS["mlm.bias"]]
    return out
