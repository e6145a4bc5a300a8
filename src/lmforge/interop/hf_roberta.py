"""Hugging Face RoBERTa checkpoints <-> lmforge ``Encoder`` and ``MaskedLMHeads``.

RoBERTa (Liu et al. 2019) is BERT's encoder trained by another recipe, so its layer names are BERT's and its body
sits under ``roberta.``. Two things differ, and they are the quirks this module handles:

- **Positions start after the padding id.** transformers numbers a row's real tokens ``pad_token_id + 1,
  pad_token_id + 2, ...`` (fairseq's convention) and gives padding the position ``pad_token_id``; the first
  ``pad_token_id + 1`` rows of ``position_embeddings`` are never read by a real token. Our encoder numbers positions
  from 0, so the import drops those rows (``max_seq_len = max_position_embeddings - pad_token_id - 1``) and the
  export puts them back (zeros; transformers' own initialisation keeps the padding row at zero). With right padding,
  every real token then sees the same position vector on both sides.
- **The MLM head is ``lm_head``** (``dense``, ``layer_norm``, ``bias``; ``decoder`` is the tied word embedding) and
  its activation is exact GELU whatever ``hidden_act`` says: a model with another activation is refused rather than
  imported to compute something else.

``RobertaForSequenceClassification`` has no pooler: its head is a dense layer with tanh over ``<s>``, which
``lmforge.interop.hf_tasks`` maps to a sequence head with ``hidden="tanh"`` over an encoder without a pooler
(``config_from_hf`` sets ``pooler=False`` for that class).
Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop import hf_bert
from lmforge.interop.common import ACT_TO_HF, check_architecture, refuse_export
from lmforge.interop.keymap import KeyMap, with_leaves

__all__ = ["ARCHITECTURES", "KEYS", "config_from_hf", "config_to_hf", "position_offset", "state_dict_from_hf",
           "state_dict_to_hf"]

ARCHITECTURES = ("RobertaModel", "RobertaForMaskedLM")
_POSITIONS = "embeddings.positions.weight"
# the task classes without a pooler whose head reads <s> itself (see hf_tasks)
_WITHOUT_POOLER = ("RobertaForSequenceClassification",)

KEYS = KeyMap(
    family="RoBERTa",
    checkpoints="a RobertaModel or RobertaForMaskedLM (or a RoBERTa task model)",
    top={**hf_bert.BERT_EMBEDDINGS, **with_leaves({"pooler.dense": "pooler.dense"})},
    layer=hf_bert.BERT_LAYER,
    prefix="roberta.",
    heads={**with_leaves({"mlm.dense": "lm_head.dense", "mlm.norm": "lm_head.layer_norm"}), "mlm.bias": "lm_head.bias"},
    tied={"lm_head.decoder.weight": "embeddings.tokens.weight", "lm_head.decoder.bias": "mlm.bias"},
    ignored=hf_bert.BERT_BUFFERS,
    exportable="only a post-LN encoder with learned positions and an MLM head can be exported",
)


def position_offset(pad_token_id: int) -> int:
    """The rows of RoBERTa's position table before the first real token's: ``pad_token_id + 1``."""
    return pad_token_id + 1


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face RoBERTa ``config.json`` dict (see the module docstring for positions).

    Raises:
        LmforgeError: a setting our encoder cannot reproduce, or a position table too short for the padding offset.
    """
    get, fields = hf_bert.encoder_config_fields(hf, "RoBERTa")
    offset = position_offset(fields["pad_token_id"])
    length = get("max_position_embeddings", 514) - offset
    if length < 1:
        raise LmforgeError(f"max_position_embeddings={get('max_position_embeddings', 514)} leaves no position after "
                           f"RoBERTa's padding offset ({offset} = pad_token_id + 1)")
    architecture = (hf.get("architectures") or [None])[0]
    return ModelConfig(**{**fields, "max_seq_len": length, "pooler": architecture not in _WITHOUT_POOLER,
                          "hf_layout": "roberta"})


def config_to_hf(config: ModelConfig, architecture: str = "RobertaForMaskedLM") -> dict[str, Any]:
    """A Hugging Face ``RobertaConfig`` dict for ``config``: positions widened by the padding offset, the special
    ids of the model's vocabulary.

    Raises:
        LmforgeError: what RoBERTa cannot express (named).
    """
    check_architecture(architecture, ARCHITECTURES)
    problems = hf_bert.encoder_export_problems(config, "RoBERTa")
    if config.type_vocab_size < 1:
        problems.append("type_vocab_size=0 (RoBERTa has a segment embedding; a model without one exports as "
                        "DistilBERT)")
    if architecture == "RobertaForMaskedLM" and config.activation != "gelu":
        problems.append(f"activation={config.activation!r} with an MLM head (RoBERTa's lm_head is always GELU)")
    refuse_export(problems, "RoBERTa")
    out = hf_bert.encoder_config_dict(config, architecture, "roberta", position_embedding_type="absolute")
    out["max_position_embeddings"] = config.max_seq_len + position_offset(config.pad_token_id)
    return out


def state_dict_from_hf(hf_sd: Mapping[str, Tensor], config: ModelConfig
                       ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
    """Rename a Hugging Face RoBERTa state dict to ours (``(encoder_sd, heads_sd or None)``), the position table cut
    to the rows real tokens read.

    Raises:
        LmforgeError: an unexpected key (named), an untied decoder, a position table of another length than the
            config's, or an MLM head with an activation other than GELU.
    """
    state = KEYS.from_hf(hf_sd)
    positions = state.get(_POSITIONS)
    if positions is not None:
        offset = position_offset(config.pad_token_id)
        if positions.shape[0] != config.max_seq_len + offset:
            raise LmforgeError(f"the position table has {positions.shape[0]} rows, the config "
                               f"max_position_embeddings={config.max_seq_len + offset}")
        state[_POSITIONS] = positions[offset:]
    encoder_sd, heads_sd = KEYS.split_heads(state)
    if heads_sd is not None and config.activation != "gelu":
        raise LmforgeError(f"a RobertaForMaskedLM with hidden_act {ACT_TO_HF.get(config.activation)!r}: its lm_head "
                           "applies exact GELU whatever hidden_act says, lmforge's MLM head the model's activation; "
                           "only hidden_act 'gelu' is supported")
    return encoder_sd, heads_sd


def state_dict_to_hf(encoder_sd: Mapping[str, Tensor], heads_sd: Mapping[str, Tensor] | None, config: ModelConfig,
                     *, prefixed: bool | None = None, include_tied: bool = True) -> dict[str, Tensor]:
    """Rename our state dicts to a Hugging Face RoBERTa one, the padding offset's rows put back in front of the
    position table (zeros).

    Args:
        heads_sd: an ``"mlm"`` head's state dict (``RobertaForMaskedLM``), or None.
        prefixed: put the body under ``roberta.`` (default: when there are heads).
        include_tied: with heads, also write ``lm_head.decoder.*`` (see ``hf_bert.state_dict_to_hf``).
    """
    prefixed = heads_sd is not None if prefixed is None else prefixed
    state = dict(encoder_sd)
    positions = state.get(_POSITIONS)
    if positions is not None:
        pad = torch.zeros(position_offset(config.pad_token_id), positions.shape[1], dtype=positions.dtype,
                          device=positions.device)
        state[_POSITIONS] = torch.cat([pad, positions])
    return KEYS.to_hf({**state, **(heads_sd or {})}, prefixed=prefixed, include_tied=include_tied)
