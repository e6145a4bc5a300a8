"""Hugging Face BERT checkpoints <-> lmforge ``Encoder`` and ``BertPreTrainingHeads``.

The only module where Hugging Face's BERT names appear. Layouts handled (names checked against transformers'
``BertModel`` / ``BertForPreTraining`` / ``BertForMaskedLM`` state dicts):

- ``BertModel``: ``embeddings.word_embeddings.weight``, ``encoder.layer.{i}.attention.self.query.weight``, ...,
  ``pooler.dense.*`` (no prefix).
- ``BertForPreTraining`` / ``BertForMaskedLM``: the same under ``bert.``, plus ``cls.predictions.*`` (MLM) and,
  for pretraining, ``cls.seq_relationship.*`` (NSP). ``BertForMaskedLM`` has no pooler and no NSP head.

Google's original TF-converted checkpoints call LayerNorm parameters ``gamma`` / ``beta``; both spellings load.

BERT is the root of the encoder families: ALBERT, DistilBERT and ELECTRA reuse its embedding and layer names and
its config reading (``encoder_config_fields`` / ``encoder_config_dict``) where theirs are the same.
Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop.common import ACT_TO_HF, activation_from_hf, check_model_type, config_reader, refuse_export
from lmforge.interop.keymap import KeyMap, with_leaves

__all__ = ["BERT_BUFFERS", "BERT_EMBEDDINGS", "BERT_LAYER", "KEYS", "TIED_DECODER_WEIGHT", "config_from_hf",
           "config_to_hf", "encoder_config_dict", "encoder_config_fields", "encoder_export_problems", "encoder_layer",
           "is_hf_bert_dir", "state_dict_from_hf", "state_dict_to_hf"]

# Ours -> HF for the embeddings, relative to the encoder; ALBERT, DistilBERT and ELECTRA name theirs the same.
BERT_EMBEDDINGS = {
    "embeddings.tokens.weight": "embeddings.word_embeddings.weight",
    "embeddings.positions.weight": "embeddings.position_embeddings.weight",
    "embeddings.segments.weight": "embeddings.token_type_embeddings.weight",
    **with_leaves({"embeddings.norm": "embeddings.LayerNorm"}),
}


def encoder_layer(*, q: str, k: str, v: str, out: str, attn_norm: str, fc1: str, fc2: str, ffn_norm: str
                  ) -> dict[str, str]:
    """The layer table of a BERT-family layout: our post-LN encoder layer's parameters (weight and bias of each
    module) -> the layout's names for its attention projections, attention LayerNorm, feed-forward layers and
    feed-forward LayerNorm."""
    theirs = (q, k, v, out, attn_norm, fc1, fc2, ffn_norm)
    ours = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "self_attn_norm",
            "ffn.fc1", "ffn.fc2", "ffn_norm")
    return with_leaves(dict(zip(ours, theirs, strict=True)))


# Inside encoder.layer.{i} (ELECTRA's layers are BERT's).
BERT_LAYER = encoder_layer(q="attention.self.query", k="attention.self.key", v="attention.self.value",
                           out="attention.output.dense", attn_norm="attention.output.LayerNorm",
                           fc1="intermediate.dense", fc2="output.dense", ffn_norm="output.LayerNorm")
# Buffers that some checkpoints carry and that carry no weights.
BERT_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")

TIED_DECODER_WEIGHT = "cls.predictions.decoder.weight"
KEYS = KeyMap(
    family="BERT",
    checkpoints="a BertModel, BertForPreTraining or BertForMaskedLM",
    top={**BERT_EMBEDDINGS, **with_leaves({"pooler.dense": "pooler.dense"})},
    layer=BERT_LAYER,
    prefix="bert.",
    heads={
        **with_leaves({"mlm.dense": "cls.predictions.transform.dense",
                       "mlm.norm": "cls.predictions.transform.LayerNorm"}),
        "mlm.bias": "cls.predictions.bias",
        **with_leaves({"nsp.classifier": "cls.seq_relationship"}),
    },
    # the decoder weight is the tied word embedding, the decoder bias is cls.predictions.bias
    tied={TIED_DECODER_WEIGHT: "embeddings.tokens.weight", "cls.predictions.decoder.bias": "mlm.bias"},
    ignored=BERT_BUFFERS,
    # quirk: Google's TF-converted checkpoints spell LayerNorm's parameters gamma / beta
    spellings={"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"},
    exportable="only a post-LN encoder with learned positions and BertPreTrainingHeads can be exported",
)


# ---------------------------------------------------------------------------------------------- configs
def encoder_config_fields(hf: Mapping[str, Any], family: str, *, names: Mapping[str, str] | None = None,
                          act_default: str = "gelu", dropout_default: float = 0.1, refuse_decoders: bool = True,
                          untied_heads: str = "untied MLM decoders") -> tuple[Callable[..., Any], dict[str, Any]]:
    """Check and read the settings a BERT-family ``config.json`` (BERT, ALBERT, DistilBERT, ELECTRA) shares.

    Args:
        hf: the parsed config; its ``model_type`` (when present) must be ``family.lower()``.
        family: the family's name ("BERT", "ALBERT", "DistilBERT", "ELECTRA").
        names: the family's key for each BERT key it names otherwise (DistilBERT's ``dim`` for ``hidden_size`` ...).
        act_default / dropout_default: transformers' defaults for the activation and the two dropouts.
        refuse_decoders: refuse ``is_decoder`` / ``add_cross_attention`` (ALBERT's model ignores them).
        untied_heads: what ``tie_word_embeddings=false`` would need, for its error.

    Returns:
        ``(get, fields)``: the config's typed reader (``common.config_reader``) for the family's own keys, and the
        ``ModelConfig`` keyword arguments every BERT-family encoder has (post-LN, learned positions, tied).

    Raises:
        LmforgeError: a setting our encoder cannot reproduce (names the key, the value and what is supported).
    """
    names = names or {}
    article = "an" if family[0] in "AEIOU" else "a"
    check_model_type(hf, family.lower(), f"{article} {family} checkpoint")
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise LmforgeError(f"position_embedding_type={position_type!r} is not supported; only 'absolute' (learned) "
                           "positions can be imported")
    if refuse_decoders and (hf.get("is_decoder") or hf.get("add_cross_attention")):
        raise LmforgeError(f"this {family} config is a decoder (is_decoder / add_cross_attention); only the "
                           "bidirectional encoder can be imported")
    activation = activation_from_hf(hf, names.get("hidden_act", "hidden_act"), act_default)
    if not hf.get("tie_word_embeddings", True):
        raise LmforgeError(f"tie_word_embeddings=false: {untied_heads} are not supported")
    required = [names.get(k, k) for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers")]
    missing = [k for k in required if k not in hf]
    if missing:
        raise LmforgeError(f"{family} config lacks {', '.join(missing)}")
    get = config_reader(hf)

    def read(key: str, default: Any, kind: Any = int) -> Any:  # a BERT key, under the family's name for it
        return get(names.get(key, key), default, kind)

    hidden = read("hidden_size", None)
    return get, dict(
        arch="encoder",
        vocab_size=read("vocab_size", None),
        d_model=hidden,
        n_heads=read("num_attention_heads", None),
        n_layers=read("num_hidden_layers", None),
        d_ff=read("intermediate_size", 4 * hidden),
        max_seq_len=read("max_position_embeddings", 512),
        dropout=read("hidden_dropout_prob", dropout_default, float),
        attention_dropout=read("attention_probs_dropout_prob", dropout_default, float),
        activation=activation,
        norm_first=False,
        layer_norm_eps=read("layer_norm_eps", 1e-12, float),
        positional="learned",
        type_vocab_size=read("type_vocab_size", 2),
        tie_embeddings=True,
        pad_token_id=read("pad_token_id", None, int | None) or 0,
        init_std=read("initializer_range", 0.02, float),
    )


# The keys of a BERT-family config.json, in the order they are written; a family's own keys (embedding_size,
# the ALBERT groups, position_embedding_type, DistilBERT's sinusoidal_pos_embds) are written where they stand here
# when it passes them.
_CONFIG_ORDER = ("architectures", "model_type", "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
                 "num_hidden_groups", "inner_group_num", "num_attention_heads", "intermediate_size", "hidden_act",
                 "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
                 "sinusoidal_pos_embds", "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id",
                 "position_embedding_type", "tie_word_embeddings")


def encoder_config_dict(config: ModelConfig, architecture: str, model_type: str, *,
                        names: Mapping[str, str] | None = None, without: tuple[str, ...] = (), **own: Any
                        ) -> dict[str, Any]:
    """A BERT-family ``config.json`` dict for ``config``: BERT's keys (each under ``names``' name for it, none of
    ``without``) and the family's ``own`` keys.

    The caller has checked that the family can express ``config`` (``encoder_export_problems`` and its own checks).
    """
    values = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": ACT_TO_HF[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_seq_len,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": True,
        **own,
    }
    unknown = set(values) - set(_CONFIG_ORDER)
    if unknown:
        raise ValueError(f"encoder_config_dict: no place for {sorted(unknown)}")
    names = names or {}
    return {names.get(key, key): values[key] for key in _CONFIG_ORDER if key in values and key not in without}


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face BERT ``config.json`` dict.

    Args:
        hf: the parsed config (``model_type`` "bert" if present, ``position_embedding_type`` "absolute").

    Returns:
        An encoder ``ModelConfig`` (post-LN, learned positions, tied embeddings).

    Raises:
        LmforgeError: a setting our encoder cannot reproduce (names the key, the value and what is supported).
    """
    _, fields = encoder_config_fields(hf, "BERT")
    return ModelConfig(**fields)


def config_to_hf(config: ModelConfig, architecture: str = "BertForPreTraining") -> dict[str, Any]:
    """A Hugging Face ``BertConfig`` dict (``config.json``) for ``config``.

    Args:
        config: an encoder config that BERT can express: post-LN, learned positions, tied embeddings.
        architecture: the ``architectures`` entry ("BertForPreTraining" with heads, "BertModel" without).

    Raises:
        LmforgeError: the config uses something HF's BERT does not have (names it).
    """
    refuse_export(encoder_export_problems(config, "BERT", check_arch=False), "BERT")
    return encoder_config_dict(config, architecture, "bert", position_embedding_type="absolute")


def encoder_export_problems(config: ModelConfig, layout: str, *, check_arch: bool = True) -> list[str]:
    """What every Hugging Face BERT-family layout (BERT, ALBERT, DistilBERT, ELECTRA) needs of an encoder config and
    ``config`` lacks: an encoder, post-LN, learned absolute positions, an activation HF names, tied embeddings. Each
    layout adds its own checks (segments, pooler, sharing) to the list."""
    problems = []
    if check_arch and config.arch != "encoder":
        problems.append(f"arch={config.arch!r} ({layout} is an encoder)")
    if config.norm_first:
        problems.append(f"norm_first=True (HF {layout} is post-LN)")
    if config.positional != "learned":
        problems.append(f"positional={config.positional!r} (HF {layout} has learned absolute positions)")
    if config.activation not in ACT_TO_HF:
        problems.append(f"activation={config.activation!r}")
    if not config.tie_embeddings:
        problems.append("tie_embeddings=False")
    return problems


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
    return KEYS.split_heads(KEYS.from_hf(hf_sd))


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
    return KEYS.to_hf({**encoder_sd, **(heads_sd or {})}, prefixed=heads_sd is not None, include_tied=include_tied)
