"""Hugging Face ALBERT checkpoints <-> lmforge ``Encoder`` (``embedding_size``, ``share_layers``) and heads.

The only module where Hugging Face's ALBERT names appear. Layouts handled (names checked against transformers'
``AlbertModel`` / ``AlbertForPreTraining`` / ``AlbertForMaskedLM`` state dicts):

- ``AlbertModel``: ``embeddings.{word,position,token_type}_embeddings.weight``, ``embeddings.LayerNorm.*``,
  ``encoder.embedding_hidden_mapping_in.*`` (E -> H), ``encoder.albert_layer_groups.{g}.albert_layers.{j}.*``,
  ``pooler.*`` (a plain Linear, ours ``pooler.dense.*``); no prefix.
- ``AlbertForPreTraining``: the same under ``albert.``, plus ``predictions.*`` (MLM) and
  ``sop_classifier.classifier.*`` (sentence-order prediction: ours ``nsp.classifier.*``, label 0 = in order,
  1 = swapped).
- ``AlbertForMaskedLM``: ``albert.`` + ``predictions.*``; no pooler and no SOP classifier (a loader keeps those
  freshly initialised, as for ``BertForMaskedLM``).

Layer sharing: ALBERT runs ``num_hidden_layers`` layers drawn from ``num_hidden_groups`` groups of
``inner_group_num`` layers each. lmforge reads ``inner_group_num = 1`` with one group (every layer the same
weights: ``share_layers="all"``) or one group per layer (no sharing: ``"none"``); group g is our ``layers.{g}``.
Other groupings, and our ``"attention"`` / ``"ffn"`` sharing, have no counterpart on the other side.

Embedding width: the import always sets ``embedding_size`` = E. When E equals ``hidden_size`` our encoder has no
projection, while ALBERT always has ``embedding_hidden_mapping_in``: such a checkpoint imports only if that map is
exactly the identity with zero bias (as the export of such a model writes it); otherwise it is refused.

Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lmforge.config import ModelConfig, coerce
from lmforge.errors import LmforgeError
from lmforge.interop.hf_bert import (
    _ACT_FROM_HF,
    _ACT_TO_HF,
    check_tied_decoder,
    encoder_export_problems,
    refuse_unexpected,
)

__all__ = ["config_from_hf", "config_to_hf", "state_dict_from_hf", "state_dict_to_hf"]

ARCHITECTURES = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM")

# Ours <-> HF, relative to the model ("albert." is added for the task layouts).
_EMBEDDINGS = {
    "embeddings.tokens.weight": "embeddings.word_embeddings.weight",
    "embeddings.positions.weight": "embeddings.position_embeddings.weight",
    "embeddings.segments.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    "embeddings.projection.weight": "encoder.embedding_hidden_mapping_in.weight",
    "embeddings.projection.bias": "encoder.embedding_hidden_mapping_in.bias",
    "pooler.dense.weight": "pooler.weight",
    "pooler.dense.bias": "pooler.bias",
}
_MAPPING_WEIGHT = _EMBEDDINGS["embeddings.projection.weight"]
_MAPPING_BIAS = _EMBEDDINGS["embeddings.projection.bias"]
# Inside one ALBERT layer (encoder.albert_layer_groups.{g}.albert_layers.{j}.*).
_LAYER = {
    "self_attn.q_proj": "attention.query",
    "self_attn.k_proj": "attention.key",
    "self_attn.v_proj": "attention.value",
    "self_attn.out_proj": "attention.dense",
    "self_attn_norm": "attention.LayerNorm",
    "ffn.fc1": "ffn",
    "ffn.fc2": "ffn_output",
    "ffn_norm": "full_layer_layer_norm",
}
_HEADS = {
    "mlm.dense.weight": "predictions.dense.weight",
    "mlm.dense.bias": "predictions.dense.bias",
    "mlm.norm.weight": "predictions.LayerNorm.weight",
    "mlm.norm.bias": "predictions.LayerNorm.bias",
    "mlm.bias": "predictions.bias",
    "nsp.classifier.weight": "sop_classifier.classifier.weight",
    "nsp.classifier.bias": "sop_classifier.classifier.bias",
}
_HEAD_PREFIXES = ("predictions.", "sop_classifier.")
# Copies of other entries: the decoder weight is the tied word embedding (E wide), the decoder bias is
# predictions.bias. Checked on import, written on export when asked (transformers 5 saves neither).
TIED_DECODER_WEIGHT = "predictions.decoder.weight"
_TIED_DECODER_BIAS = "predictions.decoder.bias"
_IGNORED = {"embeddings.position_ids", "embeddings.token_type_ids"}

_HF_LAYER_KEY = re.compile(r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)\.(.+)\.(weight|bias)")
_FROM_HF_EMBEDDINGS = {hf: ours for ours, hf in _EMBEDDINGS.items()}
_FROM_HF_LAYER = {hf: ours for ours, hf in _LAYER.items()}
_FROM_HF_HEADS = {hf: ours for ours, hf in _HEADS.items()}


# ---------------------------------------------------------------------------------------------- configs
def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face ALBERT ``config.json`` dict.

    Args:
        hf: the parsed config (``model_type`` "albert" if present). Keys transformers' ALBERT ignores (the
            original release's ``down_scale_factor``, ``gap_size``, ``net_structure_type`` ...) are ignored here too.

    Returns:
        An encoder ``ModelConfig`` with ``embedding_size`` = E and ``share_layers`` "all" (one hidden group) or
        "none" (one group per layer).

    Raises:
        LmforgeError: a setting our encoder cannot reproduce (names the key, the value and what is supported).
    """
    model_type = hf.get("model_type", "albert")
    if model_type != "albert":
        raise LmforgeError(f"config model_type={model_type!r} is not an ALBERT checkpoint (expected 'albert')")
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise LmforgeError(f"position_embedding_type={position_type!r} is not supported; only 'absolute' (learned) "
                           "positions can be imported")
    act = hf.get("hidden_act", "gelu_new")
    if not isinstance(act, str) or act not in _ACT_FROM_HF:
        raise LmforgeError(f"hidden_act={act!r} is not supported; choose one of {', '.join(_ACT_FROM_HF)}")
    if not hf.get("tie_word_embeddings", True):
        raise LmforgeError("tie_word_embeddings=false: untied MLM decoders are not supported")
    missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers") if k not in hf]
    if missing:
        raise LmforgeError(f"ALBERT config lacks {', '.join(missing)}")

    def get(key: str, default: Any, kind: Any = int) -> Any:  # checked before any arithmetic on the value
        return coerce(hf.get(key, default), kind, key)

    hidden, n_layers = get("hidden_size", None), get("num_hidden_layers", None)
    inner = get("inner_group_num", 1)
    if inner != 1:
        raise LmforgeError(f"inner_group_num={inner} is not supported; lmforge reads ALBERT checkpoints with "
                           "inner_group_num=1 (one layer per hidden group)")
    groups = get("num_hidden_groups", 1)
    if groups == 1 and n_layers > 1:
        share = "all"
    elif groups == n_layers:
        share = "none"
    else:
        raise LmforgeError(f"num_hidden_groups={groups} with num_hidden_layers={n_layers} is not supported; lmforge "
                           f"reads num_hidden_groups=1 (every layer shares one set of weights) or {n_layers} (no "
                           "sharing)")
    return ModelConfig(
        arch="encoder",
        vocab_size=get("vocab_size", None),
        d_model=hidden,
        n_heads=get("num_attention_heads", None),
        n_layers=n_layers,
        d_ff=get("intermediate_size", 4 * hidden),
        max_seq_len=get("max_position_embeddings", 512),
        dropout=get("hidden_dropout_prob", 0.0, float),
        attention_dropout=get("attention_probs_dropout_prob", 0.0, float),
        activation=_ACT_FROM_HF[act],
        norm_first=False,
        layer_norm_eps=get("layer_norm_eps", 1e-12, float),
        positional="learned",
        type_vocab_size=get("type_vocab_size", 2),
        tie_embeddings=True,
        pad_token_id=get("pad_token_id", None, int | None) or 0,
        init_std=get("initializer_range", 0.02, float),
        embedding_size=get("embedding_size", 128),
        share_layers=share,
        pooler=True,
    )


def config_to_hf(config: ModelConfig, architecture: str = "AlbertForPreTraining") -> dict[str, Any]:
    """A Hugging Face ``AlbertConfig`` dict (``config.json``) for ``config``.

    ``share_layers="all"`` is written as ``num_hidden_groups=1``, ``"none"`` as ``num_hidden_groups =
    num_hidden_layers``; ``embedding_size`` None as E = ``hidden_size`` (with an identity
    ``embedding_hidden_mapping_in``, see ``state_dict_to_hf``).

    Args:
        config: an encoder config ALBERT can express: post-LN, learned positions, tied embeddings, a segment
            embedding, and a pooler unless ``architecture`` is "AlbertForMaskedLM" (which has none).
        architecture: one of ``ARCHITECTURES``, the ``architectures`` entry.

    Raises:
        LmforgeError: the config uses something HF's ALBERT does not have (names each option).
    """
    if architecture not in ARCHITECTURES:
        raise LmforgeError(f"architecture={architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
    problems = encoder_export_problems(config, "ALBERT")
    if config.share_layers not in ("all", "none"):
        problems.append(f"share_layers={config.share_layers!r} (HF ALBERT shares whole layers or nothing: "
                        "share_layers 'all' or 'none')")
    if config.type_vocab_size < 1:
        problems.append(f"type_vocab_size={config.type_vocab_size} (HF ALBERT always has a segment embedding)")
    if not config.pooler and architecture != "AlbertForMaskedLM":
        problems.append(f"pooler=False ({architecture} has a pooler; only AlbertForMaskedLM has none)")
    if problems:
        raise LmforgeError("cannot express this model as a Hugging Face ALBERT: " + "; ".join(problems))
    return {
        "architectures": [architecture],
        "model_type": "albert",
        "vocab_size": config.vocab_size,
        "embedding_size": config.d_embedding,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_hidden_groups": 1 if config.share_layers == "all" else config.n_layers,
        "inner_group_num": 1,
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
        "tie_word_embeddings": True,
    }


# ---------------------------------------------------------------------------------------------- state dicts
def _is_identity(weight: Tensor, bias: Tensor | None) -> bool:
    if weight.is_meta or (bias is not None and bias.is_meta):  # shapes only: the real load checks the values
        return True
    eye = torch.eye(weight.shape[0], dtype=weight.dtype, device=weight.device)
    return torch.equal(weight, eye) and (bias is None or not bool(bias.any()))


def state_dict_from_hf(hf_sd: Mapping[str, Tensor], config: ModelConfig | None = None
                       ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """Rename a Hugging Face ALBERT state dict to ours.

    Args:
        hf_sd: an ``AlbertModel`` state dict (no prefix), or an ``AlbertForPreTraining`` / ``AlbertForMaskedLM`` one
            (``albert.`` prefix, ``predictions.*`` and ``sop_classifier.*``). Known buffers are skipped.
        config: the model's config (from ``config_from_hf``); when given, hidden groups beyond what its
            ``share_layers`` reads (one group for "all") are an error instead of silently overwriting layer 0.

    Returns:
        ``(encoder_sd, heads_sd)``: the ``Encoder`` state dict (hidden group g -> ``layers.{g}``; with one group the
        other layers are the encoder's aliases of layer 0) and the ``BertPreTrainingHeads`` state dict (SOP as
        ``nsp.*``) or None when the checkpoint has no heads. Tensors are shared, not copied. ``AlbertForMaskedLM``
        lacks ``pooler.*`` and ``nsp.*``: load with ``strict=False`` and check that only they are missing. A square
        identity ``embedding_hidden_mapping_in`` (E = hidden size) is dropped: our encoder has no projection then.

    Raises:
        LmforgeError: an unexpected key (named), a hidden group with more than one layer, more groups than the
            config reads, a square mapping that is not the identity, or an untied decoder.
    """
    keys = [k for k in hf_sd if not k.startswith(_HEAD_PREFIXES)]
    prefixed = bool(keys) and all(k.startswith("albert.") for k in keys)
    max_groups = None if config is None else (1 if config.share_layers == "all" else config.n_layers)
    encoder_sd: dict[str, Tensor] = {}
    heads_sd: dict[str, Tensor] = {}
    decoder_weight = decoder_bias = None
    unexpected, inner, extra_groups = [], set(), set()
    for raw_key, value in hf_sd.items():
        key = raw_key
        if key.startswith(_HEAD_PREFIXES):
            if key == TIED_DECODER_WEIGHT:
                decoder_weight = value
            elif key == _TIED_DECODER_BIAS:
                decoder_bias = value
            elif key in _FROM_HF_HEADS:
                heads_sd[_FROM_HF_HEADS[key]] = value
            else:
                unexpected.append(raw_key)
            continue
        if prefixed:
            key = key[len("albert."):]
        if key in _IGNORED:
            continue
        if key in _FROM_HF_EMBEDDINGS:
            encoder_sd[_FROM_HF_EMBEDDINGS[key]] = value
            continue
        m = _HF_LAYER_KEY.fullmatch(key)
        if m is None or m.group(3) not in _FROM_HF_LAYER:
            unexpected.append(raw_key)
            continue
        group, layer = int(m.group(1)), int(m.group(2))
        if layer != 0:
            inner.add(layer)
        elif max_groups is not None and group >= max_groups:
            extra_groups.add(group)
        else:
            encoder_sd[f"layers.{group}.{_FROM_HF_LAYER[m.group(3)]}.{m.group(4)}"] = value
    refuse_unexpected(unexpected, "ALBERT", "an AlbertModel, AlbertForPreTraining or AlbertForMaskedLM")
    if inner:
        raise LmforgeError(f"the ALBERT state dict has {max(inner) + 1} layers per hidden group (inner_group_num="
                           f"{max(inner) + 1}); lmforge reads inner_group_num=1 only")
    if extra_groups:
        raise LmforgeError(f"the ALBERT state dict has hidden group(s) {sorted(extra_groups)[:5]} but its config "
                           f"reads {max_groups} (num_hidden_groups); the weights do not match the config")
    mapping = encoder_sd.get("embeddings.projection.weight")
    if mapping is not None and mapping.dim() == 2 and mapping.shape[0] == mapping.shape[1]:
        bias = encoder_sd.get("embeddings.projection.bias")
        if not _is_identity(mapping, bias):
            raise LmforgeError(f"embedding_size equals hidden_size ({mapping.shape[0]}) and {_MAPPING_WEIGHT!r} is "
                               "not the identity with zero bias: lmforge's encoder has no embedding projection when "
                               "the sizes are equal, so this checkpoint cannot be imported")
        del encoder_sd["embeddings.projection.weight"]
        encoder_sd.pop("embeddings.projection.bias", None)
    if decoder_bias is not None:
        heads_sd.setdefault("mlm.bias", decoder_bias)
    if decoder_weight is not None and not decoder_weight.is_meta:
        check_tied_decoder(encoder_sd.get("embeddings.tokens.weight"), decoder_weight, TIED_DECODER_WEIGHT)
    return encoder_sd, (heads_sd or None)


def state_dict_to_hf(encoder_sd: Mapping[str, Tensor], heads_sd: Mapping[str, Tensor] | None = None, *,
                     share_layers: str = "none", include_tied: bool = True) -> dict[str, Tensor]:
    """Rename our state dicts to a Hugging Face ALBERT state dict.

    Args:
        encoder_sd: an ``Encoder`` state dict (post-LN, learned positions, segment embedding). Without
            ``embeddings.projection.*`` (E = d_model) an identity ``embedding_hidden_mapping_in`` with zero bias is
            written, which computes exactly what our encoder does.
        heads_sd: ``BertPreTrainingHeads`` state dict (with ``nsp.*``: ``AlbertForPreTraining``), a
            ``MaskedLMHeads`` one (no ``nsp.*``: ``AlbertForMaskedLM``, which has no pooler, so ``pooler.*`` is left
            out), or None (``AlbertModel``).
        share_layers: the config's; "all" writes layer 0 as the one hidden group (every other index must alias
            it), "none" writes layer i as group i.
        include_tied: with heads, also write ``predictions.decoder.weight`` (= the word embedding) and
            ``predictions.decoder.bias`` (= ``predictions.bias``), as ``AlbertForPreTraining.state_dict()`` has them
            (pass False before ``safetensors.torch.save_file``: they share memory with other entries).

    Raises:
        LmforgeError: ``share_layers`` "attention" / "ffn" (no ALBERT counterpart), layers that should be shared
            but differ, or a key with no ALBERT name (named).
    """
    if share_layers not in ("all", "none"):
        raise LmforgeError(f"share_layers={share_layers!r} cannot be written as a Hugging Face ALBERT: it shares "
                           "whole layers (num_hidden_groups=1, share_layers='all') or nothing ('none')")
    prefix = "" if heads_sd is None else "albert."
    masked_lm = heads_sd is not None and not any(k.startswith("nsp.") for k in heads_sd)
    out: dict[str, Tensor] = {}
    unknown, unshared = [], []
    for key, value in encoder_sd.items():
        if key in _EMBEDDINGS:
            if not (masked_lm and key.startswith("pooler.")):
                out[prefix + _EMBEDDINGS[key]] = value
            continue
        parts = key.split(".", 2)
        module, _, leaf = parts[2].rpartition(".") if len(parts) == 3 else ("", "", "")
        if parts[0] != "layers" or not parts[1].isdigit() or module not in _LAYER or leaf not in ("weight", "bias"):
            unknown.append(key)
            continue
        index = int(parts[1])
        if share_layers == "all" and index > 0:
            first = encoder_sd.get(f"layers.0.{parts[2]}")
            if first is None or not (first is value or torch.equal(first, value)):
                unshared.append(key)
            continue
        out[f"{prefix}encoder.albert_layer_groups.{index}.albert_layers.0.{_LAYER[module]}.{leaf}"] = value
    for key, value in (heads_sd or {}).items():
        if key in _HEADS:
            out[_HEADS[key]] = value
        else:
            unknown.append(key)
    if unknown:
        raise LmforgeError(f"no Hugging Face ALBERT name for key(s) {', '.join(map(repr, unknown))}; only a post-LN "
                           "encoder with learned positions and BERT-style MLM / SOP heads can be exported")
    if unshared:
        raise LmforgeError(f"share_layers='all' but {unshared[0]!r} differs from layer 0's; the weights are not "
                           "shared")
    tokens = out.get(prefix + _EMBEDDINGS["embeddings.tokens.weight"])
    if prefix + _MAPPING_WEIGHT not in out and tokens is not None:
        width = tokens.shape[1]
        hidden = out.get(f"{prefix}encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight")
        if hidden is not None and hidden.shape[0] != width:
            raise LmforgeError(f"the token embedding is {width} wide but the layers {hidden.shape[0]}, and the state "
                               "dict has no embeddings.projection to map between them")
        out[prefix + _MAPPING_WEIGHT] = torch.eye(width, dtype=tokens.dtype, device=tokens.device)
        out[prefix + _MAPPING_BIAS] = torch.zeros(width, dtype=tokens.dtype, device=tokens.device)
    if heads_sd is not None and include_tied and tokens is not None:
        out[TIED_DECODER_WEIGHT] = tokens
        if _HEADS["mlm.bias"] in out:
            out[_TIED_DECODER_BIAS] = out[_HEADS["mlm.bias"]]
    return out
