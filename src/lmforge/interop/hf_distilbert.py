"""Hugging Face DistilBERT checkpoints <-> lmforge ``Encoder`` (``type_vocab_size=0``, ``pooler=False``) and
``MaskedLMHeads``.

The only module where Hugging Face's DistilBERT names appear. Layouts handled (names checked against transformers'
``DistilBertModel`` / ``DistilBertForMaskedLM`` state dicts):

- ``DistilBertModel``: ``embeddings.{word,position}_embeddings.weight``, ``embeddings.LayerNorm.*``,
  ``transformer.layer.{i}.{attention.{q,k,v,out}_lin, sa_layer_norm, ffn.lin1, ffn.lin2, output_layer_norm}.*``;
  no prefix, no segment embedding, no pooler.
- ``DistilBertForMaskedLM``: the same under ``distilbert.``, plus ``vocab_transform`` (ours ``mlm.dense``),
  ``vocab_layer_norm`` (``mlm.norm``) and ``vocab_projector`` (weight tied to the word embedding, bias =
  ``mlm.bias``), i.e. ``{"type": "mlm"}`` heads.

DistilBERT's LayerNorms all use eps 1e-12 (fixed in its code, not a config key). ``sinusoidal_pos_embds=true``
checkpoints store their (frozen) sinusoid table as ``position_embeddings.weight``; they import as a learned table
holding exactly those values (same outputs; lmforge does not freeze it). The export always writes learned positions.

Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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

ARCHITECTURES = ("DistilBertModel", "DistilBertForMaskedLM")
LAYER_NORM_EPS = 1e-12  # hard-coded in transformers' DistilBERT

_EMBEDDINGS = {
    "embeddings.tokens.weight": "embeddings.word_embeddings.weight",
    "embeddings.positions.weight": "embeddings.position_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
}
_LAYER = {
    "self_attn.q_proj": "attention.q_lin",
    "self_attn.k_proj": "attention.k_lin",
    "self_attn.v_proj": "attention.v_lin",
    "self_attn.out_proj": "attention.out_lin",
    "self_attn_norm": "sa_layer_norm",
    "ffn.fc1": "ffn.lin1",
    "ffn.fc2": "ffn.lin2",
    "ffn_norm": "output_layer_norm",
}
_HEADS = {
    "mlm.dense.weight": "vocab_transform.weight",
    "mlm.dense.bias": "vocab_transform.bias",
    "mlm.norm.weight": "vocab_layer_norm.weight",
    "mlm.norm.bias": "vocab_layer_norm.bias",
    "mlm.bias": "vocab_projector.bias",
}
_HEAD_PREFIXES = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.")
TIED_DECODER_WEIGHT = "vocab_projector.weight"  # = the word embedding; transformers 5 does not save it
_IGNORED = {"embeddings.position_ids"}

_HF_LAYER_KEY = re.compile(r"transformer\.layer\.(\d+)\.(.+)\.(weight|bias)")
_FROM_HF_EMBEDDINGS = {hf: ours for ours, hf in _EMBEDDINGS.items()}
_FROM_HF_LAYER = {hf: ours for ours, hf in _LAYER.items()}
_FROM_HF_HEADS = {hf: ours for ours, hf in _HEADS.items()}


# ---------------------------------------------------------------------------------------------- configs
def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face DistilBERT ``config.json`` dict.

    Args:
        hf: the parsed config (``model_type`` "distilbert" if present). ``qa_dropout`` and
            ``seq_classif_dropout`` belong to task heads lmforge does not import and are ignored.

    Returns:
        An encoder ``ModelConfig``: post-LN, learned positions, ``type_vocab_size=0``, ``pooler=False``, eps 1e-12.

    Raises:
        LmforgeError: a setting our encoder cannot reproduce (names the key, the value and what is supported).
    """
    model_type = hf.get("model_type", "distilbert")
    if model_type != "distilbert":
        raise LmforgeError(f"config model_type={model_type!r} is not a DistilBERT checkpoint (expected 'distilbert')")
    act = hf.get("activation", "gelu")
    if not isinstance(act, str) or act not in _ACT_FROM_HF:
        raise LmforgeError(f"activation={act!r} is not supported; choose one of {', '.join(_ACT_FROM_HF)}")
    for key in ("tie_word_embeddings", "tie_weights_"):  # the second: configs written by transformers 2-4
        if not hf.get(key, True):
            raise LmforgeError(f"{key}=false: untied MLM decoders are not supported")
    missing = [k for k in ("vocab_size", "dim", "n_heads", "n_layers") if k not in hf]
    if missing:
        raise LmforgeError(f"DistilBERT config lacks {', '.join(missing)}")

    def get(key: str, default: Any, kind: Any = int) -> Any:  # checked before any arithmetic on the value
        return coerce(hf.get(key, default), kind, key)

    get("sinusoidal_pos_embds", False, bool)  # either way the checkpoint holds the table: learned positions
    dim = get("dim", None)
    return ModelConfig(
        arch="encoder",
        vocab_size=get("vocab_size", None),
        d_model=dim,
        n_heads=get("n_heads", None),
        n_layers=get("n_layers", None),
        d_ff=get("hidden_dim", 4 * dim),
        max_seq_len=get("max_position_embeddings", 512),
        dropout=get("dropout", 0.1, float),
        attention_dropout=get("attention_dropout", 0.1, float),
        activation=_ACT_FROM_HF[act],
        norm_first=False,
        layer_norm_eps=LAYER_NORM_EPS,
        positional="learned",
        type_vocab_size=0,
        pooler=False,
        tie_embeddings=True,
        pad_token_id=get("pad_token_id", None, int | None) or 0,
        init_std=get("initializer_range", 0.02, float),
    )


def config_to_hf(config: ModelConfig, architecture: str = "DistilBertForMaskedLM") -> dict[str, Any]:
    """A Hugging Face ``DistilBertConfig`` dict (``config.json``) for ``config``.

    Args:
        config: an encoder config DistilBERT can express: post-LN, learned positions, tied embeddings, no segment
            embedding (``type_vocab_size=0``), no pooler, no factorised embedding, no layer sharing, eps 1e-12.
        architecture: one of ``ARCHITECTURES``, the ``architectures`` entry.

    Raises:
        LmforgeError: the config uses something HF's DistilBERT does not have (names each option).
    """
    if architecture not in ARCHITECTURES:
        raise LmforgeError(f"architecture={architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
    problems = encoder_export_problems(config, "DistilBERT")
    if config.type_vocab_size != 0:
        problems.append(f"type_vocab_size={config.type_vocab_size} (DistilBERT has no segment embedding: 0)")
    if config.pooler:
        problems.append("pooler=True (DistilBERT has no pooler)")
    if config.d_embedding != config.d_model:
        problems.append(f"embedding_size={config.embedding_size} (DistilBERT's embeddings are d_model wide)")
    if config.share_layers != "none":
        problems.append(f"share_layers={config.share_layers!r} (DistilBERT shares no layers)")
    if config.layer_norm_eps != LAYER_NORM_EPS:
        problems.append(f"layer_norm_eps={config.layer_norm_eps} (DistilBERT's is fixed at {LAYER_NORM_EPS})")
    if problems:
        raise LmforgeError("cannot express this model as a Hugging Face DistilBERT: " + "; ".join(problems))
    return {
        "architectures": [architecture],
        "model_type": "distilbert",
        "vocab_size": config.vocab_size,
        "dim": config.d_model,
        "n_layers": config.n_layers,
        "n_heads": config.n_heads,
        "hidden_dim": config.d_ff,
        "activation": _ACT_TO_HF[config.activation],
        "dropout": config.dropout,
        "attention_dropout": config.attention_dropout,
        "max_position_embeddings": config.max_seq_len,
        "sinusoidal_pos_embds": False,
        "initializer_range": config.init_std,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": True,
    }


# ---------------------------------------------------------------------------------------------- state dicts
def state_dict_from_hf(hf_sd: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """Rename a Hugging Face DistilBERT state dict to ours.

    Args:
        hf_sd: a ``DistilBertModel`` state dict (no prefix) or a ``DistilBertForMaskedLM`` one (``distilbert.``
            prefix and ``vocab_*`` heads). ``embeddings.position_ids`` is skipped.

    Returns:
        ``(encoder_sd, heads_sd)``: the ``Encoder`` state dict and the ``MaskedLMHeads`` state dict, or None when the
        checkpoint has no heads. Tensors are shared, not copied.

    Raises:
        LmforgeError: an unexpected key (named), or a ``vocab_projector.weight`` that is not the word embedding.
    """
    keys = [k for k in hf_sd if not k.startswith(_HEAD_PREFIXES)]
    prefixed = bool(keys) and all(k.startswith("distilbert.") for k in keys)
    encoder_sd: dict[str, Tensor] = {}
    heads_sd: dict[str, Tensor] = {}
    decoder_weight = None
    unexpected = []
    for raw_key, value in hf_sd.items():
        key = raw_key
        if key.startswith(_HEAD_PREFIXES):
            if key == TIED_DECODER_WEIGHT:
                decoder_weight = value
            elif key in _FROM_HF_HEADS:
                heads_sd[_FROM_HF_HEADS[key]] = value
            else:
                unexpected.append(raw_key)
            continue
        if prefixed:
            key = key[len("distilbert."):]
        if key in _IGNORED:
            continue
        if key in _FROM_HF_EMBEDDINGS:
            encoder_sd[_FROM_HF_EMBEDDINGS[key]] = value
            continue
        m = _HF_LAYER_KEY.fullmatch(key)
        if m is None or m.group(2) not in _FROM_HF_LAYER:
            unexpected.append(raw_key)
            continue
        encoder_sd[f"layers.{m.group(1)}.{_FROM_HF_LAYER[m.group(2)]}.{m.group(3)}"] = value
    refuse_unexpected(unexpected, "DistilBERT", "a DistilBertModel or DistilBertForMaskedLM")
    if decoder_weight is not None and not decoder_weight.is_meta:
        check_tied_decoder(encoder_sd.get("embeddings.tokens.weight"), decoder_weight, TIED_DECODER_WEIGHT)
    return encoder_sd, (heads_sd or None)


def state_dict_to_hf(encoder_sd: Mapping[str, Tensor], heads_sd: Mapping[str, Tensor] | None = None, *,
                     include_tied: bool = True) -> dict[str, Tensor]:
    """Rename our state dicts to a Hugging Face DistilBERT state dict.

    Args:
        encoder_sd: an ``Encoder`` state dict without segment embedding, projection or pooler.
        heads_sd: a ``MaskedLMHeads`` state dict (``DistilBertForMaskedLM``), or None (``DistilBertModel``).
        include_tied: with heads, also write ``vocab_projector.weight`` (= the word embedding), as
            ``DistilBertForMaskedLM.state_dict()`` has it (pass False before ``safetensors.torch.save_file``).

    Raises:
        LmforgeError: a key with no DistilBERT name (e.g. ``embeddings.segments.weight``, ``pooler.*``, ``nsp.*``).
    """
    prefix = "" if heads_sd is None else "distilbert."
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in encoder_sd.items():
        hf_key = _EMBEDDINGS.get(key)
        parts = key.split(".", 2)
        if hf_key is None and len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
            module, _, leaf = parts[2].rpartition(".")
            if module in _LAYER and leaf in ("weight", "bias"):
                hf_key = f"transformer.layer.{parts[1]}.{_LAYER[module]}.{leaf}"
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
        raise LmforgeError(f"no Hugging Face DistilBERT name for key(s) {', '.join(map(repr, unknown))}; only a "
                           "post-LN encoder without segment embedding or pooler, with MLM heads, can be exported")
    if heads_sd is not None and include_tied:
        out[TIED_DECODER_WEIGHT] = out[prefix + _EMBEDDINGS["embeddings.tokens.weight"]]
    return out
