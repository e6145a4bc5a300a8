"""Hugging Face ELECTRA checkpoints <-> lmforge ``Encoder`` and ELECTRA's heads (Clark et al. 2020).

The only module where Hugging Face's ELECTRA names appear. Layouts handled (names checked against transformers'
``ElectraModel`` / ``ElectraForPreTraining`` / ``ElectraForMaskedLM`` state dicts):

- ``ElectraModel``: ``embeddings.{word,position,token_type}_embeddings.weight``, ``embeddings.LayerNorm.*`` (all E
  wide), ``embeddings_project.*`` (E -> H, only when E != H; ours ``embeddings.projection.*``), ``encoder.layer.{i}.*``
  (BERT's layer names); no pooler (ours: ``pooler=False``, so ``pooled_output`` is h_[CLS]); no prefix.
- ``ElectraForPreTraining`` (a discriminator): ``electra.`` + the above, and ``discriminator_predictions.dense.*``
  (H -> H, then the config's hidden_act) and ``discriminator_predictions.dense_prediction.*`` (H -> 1): our ``"rtd"``
  head, keys ``rtd.dense.*`` and ``rtd.prediction.*``.
- ``ElectraForMaskedLM`` (a generator): ``electra.`` + the above, and ``generator_predictions.dense.*`` (H -> E),
  ``generator_predictions.LayerNorm.*`` (E) and ``generator_lm_head.bias`` (V): our ``"mlm"`` head (``mlm.dense``,
  ``mlm.norm``, ``mlm.bias``). ``generator_lm_head.weight`` is the tied word embedding (checked on import, written on
  export when asked). Hugging Face's generator transform always uses exact GELU, ours the config's activation: such a
  checkpoint imports only with ``hidden_act`` "gelu" (every released ELECTRA).

A Hugging Face ELECTRA generator and discriminator are two separate checkpoints; lmforge's pretraining run holds both
in one folder (``lmforge.heads.electra``): its discriminator exports as ``ElectraForPreTraining`` and its generator, an
``Encoder`` of the generator's config plus the MLM head, as ``ElectraForMaskedLM`` (``generator_state_dicts`` splits
the run's state dict).

Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop import hf_bert
from lmforge.interop.common import ACT_TO_HF, check_architecture, refuse_export
from lmforge.interop.keymap import KeyMap, with_leaves

__all__ = ["ARCHITECTURES", "KEYS", "TIED_DECODER_WEIGHT", "architecture_of", "config_from_hf", "config_to_hf",
           "generator_state_dicts", "state_dict_from_hf", "state_dict_to_hf"]

ARCHITECTURES = ("ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM")
_ARCHITECTURE_OF = {None: "ElectraModel", "rtd": "ElectraForPreTraining", "mlm": "ElectraForMaskedLM"}

# A copy of the word embedding (the tied un-embedding), checked on import, written on export when asked.
TIED_DECODER_WEIGHT = "generator_lm_head.weight"
KEYS = KeyMap(
    family="ELECTRA",
    checkpoints="an ElectraModel, ElectraForPreTraining or ElectraForMaskedLM",
    top={**hf_bert.BERT_EMBEDDINGS, **with_leaves({"embeddings.projection": "embeddings_project"})},
    layer=hf_bert.BERT_LAYER,
    prefix="electra.",
    # two heads, one per Hugging Face class: the discriminator's ("rtd") and the generator's ("mlm")
    heads={
        **with_leaves({"rtd.dense": "discriminator_predictions.dense",
                       "rtd.prediction": "discriminator_predictions.dense_prediction"}),
        **with_leaves({"mlm.dense": "generator_predictions.dense", "mlm.norm": "generator_predictions.LayerNorm"}),
        "mlm.bias": "generator_lm_head.bias",
    },
    tied={TIED_DECODER_WEIGHT: "embeddings.tokens.weight"},
    ignored=hf_bert.BERT_BUFFERS,
    exportable="only a post-LN encoder without a pooler, with learned positions, and an 'rtd' or an 'mlm' head can "
               "be exported",
)
# Heads of two kinds together have no Hugging Face class: their export names every head key as one without a name.
_WITHOUT_HEADS = dataclasses.replace(KEYS, heads={})


# ---------------------------------------------------------------------------------------------- configs
def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a Hugging Face ELECTRA ``config.json`` dict (a discriminator's or a generator's).

    Args:
        hf: the parsed config (``model_type`` "electra" if present). A missing ``embedding_size`` is 128, as
            transformers' ``ElectraConfig`` reads it.

    Returns:
        An encoder ``ModelConfig``: post-LN, learned positions, tied embeddings, no pooler, ``embedding_size`` = E
        when it differs from ``hidden_size`` (else None: no projection on either side).

    Raises:
        LmforgeError: a setting our encoder cannot reproduce (names the key, the value and what is supported).
    """
    get, fields = hf_bert.encoder_config_fields(hf, "ELECTRA", untied_heads="untied generator heads")
    embedding = get("embedding_size", 128)
    return ModelConfig(**fields, embedding_size=None if embedding == fields["d_model"] else embedding, pooler=False)


def config_to_hf(config: ModelConfig, architecture: str = "ElectraForPreTraining") -> dict[str, Any]:
    """A Hugging Face ``ElectraConfig`` dict (``config.json``) for ``config``.

    Args:
        config: an encoder config ELECTRA can express: post-LN, learned positions, tied embeddings, a segment
            embedding, no pooler, no layer sharing; for ``ElectraForMaskedLM`` the activation "gelu" (Hugging Face's
            generator transform is always GELU).
        architecture: one of ``ARCHITECTURES``, the ``architectures`` entry.

    Raises:
        LmforgeError: the config uses something HF's ELECTRA does not have (names each option).
    """
    check_architecture(architecture, ARCHITECTURES)
    problems = hf_bert.encoder_export_problems(config, "ELECTRA")
    if config.share_layers != "none":
        problems.append(f"share_layers={config.share_layers!r} (HF ELECTRA shares no layers)")
    if config.type_vocab_size < 1:
        problems.append(f"type_vocab_size={config.type_vocab_size} (HF ELECTRA always has a segment embedding)")
    if config.pooler:
        problems.append("pooler=True (HF ELECTRA has no pooler)")
    if architecture == "ElectraForMaskedLM" and config.activation != "gelu":
        problems.append(f"activation={config.activation!r} with an MLM head (HF's generator transform is always "
                        "GELU)")
    refuse_export(problems, "ELECTRA")
    return hf_bert.encoder_config_dict(config, architecture, "electra", embedding_size=config.d_embedding)


# ---------------------------------------------------------------------------------------------- state dicts
def state_dict_from_hf(hf_sd: Mapping[str, Tensor], config: ModelConfig | None = None
                       ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None, str | None]:
    """Rename a Hugging Face ELECTRA state dict to ours.

    Args:
        hf_sd: an ``ElectraModel`` state dict (no prefix), or an ``ElectraForPreTraining`` / ``ElectraForMaskedLM``
            one (``electra.`` prefix and its head). Known buffers are skipped.
        config: the model's config (from ``config_from_hf``); when given, a generator head with an activation other
            than GELU is refused (see the module docstring).

    Returns:
        ``(encoder_sd, heads_sd, head_type)``: the ``Encoder`` state dict; the head's state dict and its head type
        (``"rtd"`` for a discriminator, ``"mlm"`` for a generator), or None and None when the checkpoint has no head.
        Tensors are shared, not copied.

    Raises:
        LmforgeError: an unexpected key (named), both heads in one state dict, an untied generator decoder, or a
            generator whose activation is not GELU.
    """
    state, repeats = KEYS.rename_from_hf(hf_sd)
    # quirk: two heads, one per class: the head type is the first name component of its keys ("rtd", "mlm")
    kinds = {key.split(".", 1)[0] for key in state if key in KEYS.heads}
    if TIED_DECODER_WEIGHT in repeats:
        kinds.add("mlm")
    if len(kinds) > 1:
        raise LmforgeError("the ELECTRA state dict holds both a discriminator head (discriminator_predictions.*) and "
                           "a generator head (generator_*); Hugging Face keeps them in two checkpoints: import each "
                           "on its own")
    kind = next(iter(kinds), None)
    KEYS.resolve_tied(state, repeats)
    # quirk: Hugging Face's generator transform is exact GELU whatever hidden_act says, ours the model's activation
    if kind == "mlm" and config is not None and config.activation != "gelu":
        raise LmforgeError(f"an ElectraForMaskedLM with hidden_act {ACT_TO_HF.get(config.activation)!r}: Hugging "
                           "Face's generator head applies exact GELU whatever hidden_act says, lmforge's MLM head the "
                           "model's activation, so the outputs would differ; only hidden_act 'gelu' is supported")
    encoder_sd, heads_sd = KEYS.split_heads(state)
    return encoder_sd, heads_sd, kind


def state_dict_to_hf(encoder_sd: Mapping[str, Tensor], heads_sd: Mapping[str, Tensor] | None = None, *,
                     include_tied: bool = True) -> dict[str, Tensor]:
    """Rename our state dicts to a Hugging Face ELECTRA state dict.

    Args:
        encoder_sd: an ``Encoder`` state dict (post-LN, learned positions, no pooler).
        heads_sd: an ``"rtd"`` head's state dict (``rtd.*``: ``ElectraForPreTraining``), an ``"mlm"`` head's
            (``mlm.*``: ``ElectraForMaskedLM``), or None (``ElectraModel``).
        include_tied: with an MLM head, also write ``generator_lm_head.weight`` (= the word embedding), as
            ``ElectraForMaskedLM.state_dict()`` has it (pass False before ``safetensors.torch.save_file``: it shares
            memory with the word embedding).

    Raises:
        LmforgeError: a key with no ELECTRA name (e.g. ``pooler.*``, ``final_norm.*``), or heads of both kinds.
    """
    kinds = {key.split(".", 1)[0] for key in heads_sd or {}}
    keys = KEYS if len(kinds) <= 1 else _WITHOUT_HEADS
    return keys.to_hf({**encoder_sd, **(heads_sd or {})}, prefixed=heads_sd is not None, include_tied=include_tied)


def architecture_of(head_type: str | None) -> str:
    """The Hugging Face class an lmforge ELECTRA model with this head type exports as."""
    if head_type not in _ARCHITECTURE_OF:
        raise LmforgeError(f"a {head_type!r} head has no Hugging Face ELECTRA layout; heads that do: 'rtd' "
                           "(ElectraForPreTraining), 'mlm' (ElectraForMaskedLM), none (ElectraModel)")
    return _ARCHITECTURE_OF[head_type]


def generator_state_dicts(state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The generator's ``(encoder_sd, mlm heads_sd)`` out of an lmforge ELECTRA pretraining model's state dict.

    Args:
        state: ``TaskModel(discriminator, ElectraPreTrainingHeads).state_dict()``: keys ``backbone.*``,
            ``head.generator.*``, ``head.mlm.*``, ``head.rtd.*``. The generator's shared embedding entries are
            aliases of the backbone's; when a saved folder left them out, the backbone's are used.

    Returns:
        The generator's ``Encoder`` state dict and its ``"mlm"`` head's, ready for ``state_dict_to_hf`` with the
        generator's config (``lmforge.heads.electra.generator_config``).
    """
    encoder = {k[len("head.generator."):]: v for k, v in state.items() if k.startswith("head.generator.")}
    for name in ("tokens.weight", "positions.weight", "segments.weight", "norm.weight", "norm.bias"):
        shared = state.get(f"backbone.embeddings.{name}")
        if shared is not None:
            encoder.setdefault(f"embeddings.{name}", shared)
    heads = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.mlm.")}
    if not encoder or not heads:
        raise LmforgeError("this state dict holds no ELECTRA generator (head.generator.* and head.mlm.*); it is not "
                           "an lmforge ELECTRA pretraining model")
    return encoder, heads
