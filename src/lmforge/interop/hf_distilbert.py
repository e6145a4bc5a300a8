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

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop import hf_bert
from lmforge.interop.common import check_architecture, refuse_export
from lmforge.interop.keymap import KeyMap, with_leaves

__all__ = ["ARCHITECTURES", "KEYS", "LAYER_NORM_EPS", "TIED_DECODER_WEIGHT", "config_from_hf", "config_to_hf",
           "state_dict_from_hf", "state_dict_to_hf"]

ARCHITECTURES = ("DistilBertModel", "DistilBertForMaskedLM")
LAYER_NORM_EPS = 1e-12  # hard-coded in transformers' DistilBERT
# DistilBERT's config.json names for BERT's keys (the others it has are BERT's: vocab_size, initializer_range ...)
_CONFIG_NAMES = {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers",
                 "intermediate_size": "hidden_dim", "hidden_act": "activation", "hidden_dropout_prob": "dropout",
                 "attention_probs_dropout_prob": "attention_dropout"}

TIED_DECODER_WEIGHT = "vocab_projector.weight"  # = the word embedding; transformers 5 does not save it
KEYS = KeyMap(
    family="DistilBERT",
    checkpoints="a DistilBertModel or DistilBertForMaskedLM",
    top={k: v for k, v in hf_bert.BERT_EMBEDDINGS.items() if k != "embeddings.segments.weight"},  # no segment embedding
    hf_layer="transformer.layer.{i}.",
    layer=hf_bert.encoder_layer(q="attention.q_lin", k="attention.k_lin", v="attention.v_lin", out="attention.out_lin",
                        attn_norm="sa_layer_norm", fc1="ffn.lin1", fc2="ffn.lin2", ffn_norm="output_layer_norm"),
    prefix="distilbert.",
    heads={**with_leaves({"mlm.dense": "vocab_transform", "mlm.norm": "vocab_layer_norm"}),
           "mlm.bias": "vocab_projector.bias"},
    tied={TIED_DECODER_WEIGHT: "embeddings.tokens.weight"},
    ignored=("embeddings.position_ids",),
    exportable="only a post-LN encoder without segment embedding or pooler, with MLM heads, can be exported",
)


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
    # DistilBERT's model has no decoder mode, no segment embedding and no pooler, and a fixed LayerNorm eps
    get, fields = hf_bert.encoder_config_fields(hf, "DistilBERT", names=_CONFIG_NAMES, refuse_decoders=False)
    if not hf.get("tie_weights_", True):  # the tying switch of configs written by transformers 2-4
        raise LmforgeError("tie_weights_=false: untied MLM decoders are not supported")
    get("sinusoidal_pos_embds", False, bool)  # either way the checkpoint holds the table: learned positions
    return ModelConfig(**{**fields, "layer_norm_eps": LAYER_NORM_EPS, "type_vocab_size": 0}, pooler=False)


def config_to_hf(config: ModelConfig, architecture: str = "DistilBertForMaskedLM") -> dict[str, Any]:
    """A Hugging Face ``DistilBertConfig`` dict (``config.json``) for ``config``.

    Args:
        config: an encoder config DistilBERT can express: post-LN, learned positions, tied embeddings, no segment
            embedding (``type_vocab_size=0``), no pooler, no factorised embedding, no layer sharing, eps 1e-12.
        architecture: one of ``ARCHITECTURES``, the ``architectures`` entry.

    Raises:
        LmforgeError: the config uses something HF's DistilBERT does not have (names each option).
    """
    check_architecture(architecture, ARCHITECTURES)
    problems = hf_bert.encoder_export_problems(config, "DistilBERT")
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
    refuse_export(problems, "DistilBERT")
    return hf_bert.encoder_config_dict(config, architecture, "distilbert", names=_CONFIG_NAMES,
                               without=("type_vocab_size", "layer_norm_eps"), sinusoidal_pos_embds=False)


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
    return KEYS.split_heads(KEYS.from_hf(hf_sd))


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
    return KEYS.to_hf({**encoder_sd, **(heads_sd or {})}, prefixed=heads_sd is not None, include_tied=include_tied)
