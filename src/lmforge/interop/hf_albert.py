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

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop import hf_bert
from lmforge.interop.common import check_architecture, refuse_export
from lmforge.interop.keymap import KeyMap, with_leaves

__all__ = ["ARCHITECTURES", "KEYS", "TIED_DECODER_WEIGHT", "config_from_hf", "config_to_hf", "state_dict_from_hf",
           "state_dict_to_hf"]

ARCHITECTURES = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM")

# The decoder weight is the tied word embedding (E wide), the decoder bias is predictions.bias. Checked on import,
# written on export when asked (transformers 5 saves neither).
TIED_DECODER_WEIGHT = "predictions.decoder.weight"
_PROJECTION = "embeddings.projection.weight"  # ours; HF's embedding_hidden_mapping_in, always present
_POOLER = ("pooler.dense.weight", "pooler.dense.bias")
KEYS = KeyMap(
    family="ALBERT",
    checkpoints="an AlbertModel, AlbertForPreTraining or AlbertForMaskedLM",
    top={
        **hf_bert.BERT_EMBEDDINGS,
        **with_leaves({"embeddings.projection": "encoder.embedding_hidden_mapping_in"}),
        **dict(zip(_POOLER, ("pooler.weight", "pooler.bias"), strict=True)),  # a plain Linear
    },
    # hidden group {i} (its one layer: inner_group_num = 1) is our layer {i}; see _claim_inner_layers
    hf_layer="encoder.albert_layer_groups.{i}.albert_layers.0.",
    layer=hf_bert.encoder_layer(q="attention.query", k="attention.key", v="attention.value", out="attention.dense",
                        attn_norm="attention.LayerNorm", fc1="ffn", fc2="ffn_output", ffn_norm="full_layer_layer_norm"),
    prefix="albert.",
    heads={
        **with_leaves({"mlm.dense": "predictions.dense", "mlm.norm": "predictions.LayerNorm"}),
        "mlm.bias": "predictions.bias",
        # sentence-order prediction: our NSP classifier (label 0 = in order, 1 = swapped)
        **with_leaves({"nsp.classifier": "sop_classifier.classifier"}),
    },
    tied={TIED_DECODER_WEIGHT: "embeddings.tokens.weight", "predictions.decoder.bias": "mlm.bias"},
    ignored=hf_bert.BERT_BUFFERS,
    exportable="only a post-LN encoder with learned positions and BERT-style MLM / SOP heads can be exported",
)
# Any layer of any hidden group: only layer 0 of each has a name in KEYS.
_GROUP_LAYER_KEY = re.compile(r"encoder\.albert_layer_groups\.(\d+)\.albert_layers\.(\d+)\.(.+)")


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
    # ALBERT's model has no decoder mode (it ignores is_decoder), and its defaults differ from BERT's
    get, fields = hf_bert.encoder_config_fields(hf, "ALBERT", act_default="gelu_new", dropout_default=0.0,
                                        refuse_decoders=False)
    n_layers = fields["n_layers"]
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
    return ModelConfig(**fields, embedding_size=get("embedding_size", 128), share_layers=share, pooler=True)


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
    check_architecture(architecture, ARCHITECTURES)
    problems = hf_bert.encoder_export_problems(config, "ALBERT")
    if config.share_layers not in ("all", "none"):
        problems.append(f"share_layers={config.share_layers!r} (HF ALBERT shares whole layers or nothing: "
                        "share_layers 'all' or 'none')")
    if config.type_vocab_size < 1:
        problems.append(f"type_vocab_size={config.type_vocab_size} (HF ALBERT always has a segment embedding)")
    if not config.pooler and architecture != "AlbertForMaskedLM":
        problems.append(f"pooler=False ({architecture} has a pooler; only AlbertForMaskedLM has none)")
    refuse_export(problems, "ALBERT")
    return hf_bert.encoder_config_dict(config, architecture, "albert", embedding_size=config.d_embedding,
                               num_hidden_groups=1 if config.share_layers == "all" else config.n_layers,
                               inner_group_num=1)


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
    # quirk: layer groups. A hidden group's layers beyond the first (inner_group_num > 1) have no counterpart.
    inner: set[int] = set()

    def claim_inner_layers(key: str, value: Tensor) -> dict[str, Tensor] | None:
        m = _GROUP_LAYER_KEY.fullmatch(key)
        if m is None or int(m.group(2)) == 0 or m.group(3) not in KEYS.layer.values():
            return None
        inner.add(int(m.group(2)))
        return {}

    state, repeats = KEYS.rename_from_hf(hf_sd, claim_inner_layers)
    if inner:
        raise LmforgeError(f"the ALBERT state dict has {max(inner) + 1} layers per hidden group (inner_group_num="
                           f"{max(inner) + 1}); lmforge reads inner_group_num=1 only")
    # ... and a config that shares all layers reads one group: more would silently overwrite layer 0
    max_groups = None if config is None else (1 if config.share_layers == "all" else config.n_layers)
    groups = {int(parsed[0]) for key in state if (parsed := KEYS.our_layer_key(key)) is not None}
    extra_groups = [] if max_groups is None else sorted(g for g in groups if g >= max_groups)
    if extra_groups:
        raise LmforgeError(f"the ALBERT state dict has hidden group(s) {extra_groups[:5]} but its config reads "
                           f"{max_groups} (num_hidden_groups); the weights do not match the config")
    # quirk: HF ALBERT always maps E -> H; with E = H ours has no projection, so it must be the identity
    mapping = state.get(_PROJECTION)
    if mapping is not None and mapping.dim() == 2 and mapping.shape[0] == mapping.shape[1]:
        if not _is_identity(mapping, state.get("embeddings.projection.bias")):
            raise LmforgeError(f"embedding_size equals hidden_size ({mapping.shape[0]}) and "
                               f"{KEYS.hf_name(_PROJECTION)!r} is not the identity with zero bias: lmforge's encoder "
                               "has no embedding projection when the sizes are equal, so this checkpoint cannot be "
                               "imported")
        del state[_PROJECTION]
        state.pop("embeddings.projection.bias", None)
    KEYS.resolve_tied(state, repeats)
    return KEYS.split_heads(state)


def state_dict_to_hf(encoder_sd: Mapping[str, Tensor], heads_sd: Mapping[str, Tensor] | None = None, *,
                     share_layers: str = "none", include_tied: bool = True, prefixed: bool | None = None
                     ) -> dict[str, Tensor]:
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
        prefixed: put the body under ``albert.`` (default: when there are heads; a task class has its own).
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
    masked_lm = heads_sd is not None and not any(k.startswith("nsp.") for k in heads_sd)
    prefixed = heads_sd is not None if prefixed is None else prefixed
    state: dict[str, Tensor] = {}
    unshared = []
    for key, value in encoder_sd.items():
        if masked_lm and key in _POOLER:  # AlbertForMaskedLM has no pooler
            continue
        parsed = KEYS.our_layer_key(key)
        if share_layers == "all" and parsed is not None and parsed[1] in KEYS.layer and int(parsed[0]) > 0:
            # quirk: one hidden group for all layers: layer 0 is written, every other must be the same weights
            first = encoder_sd.get(f"layers.0.{parsed[1]}")
            if first is None or not (first is value or torch.equal(first, value)):
                unshared.append(key)
            continue
        state[key] = value
    out = KEYS.to_hf({**state, **(heads_sd or {})}, prefixed=prefixed)
    if unshared:
        raise LmforgeError(f"share_layers='all' but {unshared[0]!r} differs from layer 0's; the weights are not "
                           "shared")
    tokens = out.get(KEYS.hf_name("embeddings.tokens.weight", prefixed=prefixed))
    mapping = KEYS.hf_name(_PROJECTION, prefixed=prefixed)
    if mapping not in out and tokens is not None:
        # quirk: E = d_model, no projection of ours; HF ALBERT always has one: the identity computes the same
        width = tokens.shape[1]
        hidden = out.get(KEYS.hf_name("layers.0.self_attn.q_proj.weight", prefixed=prefixed))
        if hidden is not None and hidden.shape[0] != width:
            raise LmforgeError(f"the token embedding is {width} wide but the layers {hidden.shape[0]}, and the state "
                               "dict has no embeddings.projection to map between them")
        out[mapping] = torch.eye(width, dtype=tokens.dtype, device=tokens.device)
        out[KEYS.hf_name("embeddings.projection.bias", prefixed=prefixed)] = torch.zeros(
            width, dtype=tokens.dtype, device=tokens.device)
    if include_tied:
        KEYS.write_tied(out, prefixed=prefixed)
    return out
