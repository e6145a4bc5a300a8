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

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig, coerce
from lmforge.errors import LmforgeError
from lmforge.interop.hf_bert import (
    _ACT_FROM_HF,
    _ACT_TO_HF,
    _LAYER,
    check_tied_decoder,
    encoder_export_problems,
    refuse_unexpected,
)

__all__ = ["ARCHITECTURES", "architecture_of", "config_from_hf", "config_to_hf", "generator_state_dicts",
           "state_dict_from_hf", "state_dict_to_hf"]

ARCHITECTURES = ("ElectraModel", "ElectraForPreTraining", "ElectraForMaskedLM")

# Ours <-> HF, relative to the model ("electra." is added for the task layouts).
_EMBEDDINGS = {
    "embeddings.tokens.weight": "embeddings.word_embeddings.weight",
    "embeddings.positions.weight": "embeddings.position_embeddings.weight",
    "embeddings.segments.weight": "embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "embeddings.LayerNorm.weight",
    "embeddings.norm.bias": "embeddings.LayerNorm.bias",
    "embeddings.projection.weight": "embeddings_project.weight",
    "embeddings.projection.bias": "embeddings_project.bias",
}
# head type -> {our head key: HF key}
_HEADS = {
    "rtd": {
        "rtd.dense.weight": "discriminator_predictions.dense.weight",
        "rtd.dense.bias": "discriminator_predictions.dense.bias",
        "rtd.prediction.weight": "discriminator_predictions.dense_prediction.weight",
        "rtd.prediction.bias": "discriminator_predictions.dense_prediction.bias",
    },
    "mlm": {
        "mlm.dense.weight": "generator_predictions.dense.weight",
        "mlm.dense.bias": "generator_predictions.dense.bias",
        "mlm.norm.weight": "generator_predictions.LayerNorm.weight",
        "mlm.norm.bias": "generator_predictions.LayerNorm.bias",
        "mlm.bias": "generator_lm_head.bias",
    },
}
_ARCHITECTURE_OF = {None: "ElectraModel", "rtd": "ElectraForPreTraining", "mlm": "ElectraForMaskedLM"}
_HEAD_PREFIXES = ("discriminator_predictions.", "generator_predictions.", "generator_lm_head.")
# A copy of the word embedding (the tied un-embedding), checked on import, written on export when asked.
TIED_DECODER_WEIGHT = "generator_lm_head.weight"
# Buffers that some checkpoints carry and that carry no weights.
_IGNORED = {"embeddings.position_ids", "embeddings.token_type_ids"}

_HF_LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
_FROM_HF_EMBEDDINGS = {hf: ours for ours, hf in _EMBEDDINGS.items()}
_FROM_HF_LAYER = {hf: ours for ours, hf in _LAYER.items()}
_FROM_HF_HEADS = {hf: (kind, ours) for kind, names in _HEADS.items() for ours, hf in names.items()}


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
    model_type = hf.get("model_type", "electra")
    if model_type != "electra":
        raise LmforgeError(f"config model_type={model_type!r} is not an ELECTRA checkpoint (expected 'electra')")
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise LmforgeError(f"position_embedding_type={position_type!r} is not supported; only 'absolute' (learned) "
                           "positions can be imported")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise LmforgeError("this ELECTRA config is a decoder (is_decoder / add_cross_attention); only the "
                           "bidirectional encoder can be imported")
    act = hf.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in _ACT_FROM_HF:
        raise LmforgeError(f"hidden_act={act!r} is not supported; choose one of {', '.join(_ACT_FROM_HF)}")
    if not hf.get("tie_word_embeddings", True):
        raise LmforgeError("tie_word_embeddings=false: untied generator heads are not supported")
    missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers") if k not in hf]
    if missing:
        raise LmforgeError(f"ELECTRA config lacks {', '.join(missing)}")

    def get(key: str, default: Any, kind: Any = int) -> Any:  # checked before any arithmetic on the value
        return coerce(hf.get(key, default), kind, key)

    hidden = get("hidden_size", None)
    embedding = get("embedding_size", 128)
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
        embedding_size=None if embedding == hidden else embedding,
        pooler=False,
    )


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
    if architecture not in ARCHITECTURES:
        raise LmforgeError(f"architecture={architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
    problems = encoder_export_problems(config, "ELECTRA")
    if config.share_layers != "none":
        problems.append(f"share_layers={config.share_layers!r} (HF ELECTRA shares no layers)")
    if config.type_vocab_size < 1:
        problems.append(f"type_vocab_size={config.type_vocab_size} (HF ELECTRA always has a segment embedding)")
    if config.pooler:
        problems.append("pooler=True (HF ELECTRA has no pooler)")
    if architecture == "ElectraForMaskedLM" and config.activation != "gelu":
        problems.append(f"activation={config.activation!r} with an MLM head (HF's generator transform is always "
                        "GELU)")
    if problems:
        raise LmforgeError("cannot express this model as a Hugging Face ELECTRA: " + "; ".join(problems))
    return {
        "architectures": [architecture],
        "model_type": "electra",
        "vocab_size": config.vocab_size,
        "embedding_size": config.d_embedding,
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
        "tie_word_embeddings": True,
    }


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
    keys = [k for k in hf_sd if not k.startswith(_HEAD_PREFIXES)]
    prefixed = bool(keys) and all(k.startswith("electra.") for k in keys)
    encoder_sd: dict[str, Tensor] = {}
    heads_sd: dict[str, Tensor] = {}
    kinds: set[str] = set()
    decoder_weight = None
    unexpected = []
    for raw_key, value in hf_sd.items():
        if raw_key.startswith(_HEAD_PREFIXES):
            if raw_key == TIED_DECODER_WEIGHT:
                decoder_weight = value
                kinds.add("mlm")
            elif raw_key in _FROM_HF_HEADS:
                kind, ours = _FROM_HF_HEADS[raw_key]
                kinds.add(kind)
                heads_sd[ours] = value
            else:
                unexpected.append(raw_key)
            continue
        key = raw_key[len("electra."):] if prefixed else raw_key
        if key in _IGNORED:
            continue
        m = _HF_LAYER_KEY.fullmatch(key)
        if key in _FROM_HF_EMBEDDINGS:
            encoder_sd[_FROM_HF_EMBEDDINGS[key]] = value
        elif m is not None and m.group(2) in _FROM_HF_LAYER:
            encoder_sd[f"layers.{m.group(1)}.{_FROM_HF_LAYER[m.group(2)]}.{m.group(3)}"] = value
        else:
            unexpected.append(raw_key)
    refuse_unexpected(unexpected, "ELECTRA", "an ElectraModel, ElectraForPreTraining or ElectraForMaskedLM")
    if len(kinds) > 1:
        raise LmforgeError("the ELECTRA state dict holds both a discriminator head (discriminator_predictions.*) and "
                           "a generator head (generator_*); Hugging Face keeps them in two checkpoints: import each "
                           "on its own")
    kind = next(iter(kinds), None)
    if decoder_weight is not None and not decoder_weight.is_meta:
        check_tied_decoder(encoder_sd.get("embeddings.tokens.weight"), decoder_weight, TIED_DECODER_WEIGHT)
    if kind == "mlm" and config is not None and config.activation != "gelu":
        raise LmforgeError(f"an ElectraForMaskedLM with hidden_act {_ACT_TO_HF.get(config.activation)!r}: Hugging "
                           "Face's generator head applies exact GELU whatever hidden_act says, lmforge's MLM head the "
                           "model's activation, so the outputs would differ; only hidden_act 'gelu' is supported")
    return encoder_sd, (heads_sd or None), kind


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
    kind = next(iter(kinds), None)
    prefix = "" if heads_sd is None else "electra."
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
    names = _HEADS.get(kind, {}) if len(kinds) == 1 else {}
    for key, value in (heads_sd or {}).items():
        if key in names:
            out[names[key]] = value
        else:
            unknown.append(key)
    if unknown:
        raise LmforgeError(f"no Hugging Face ELECTRA name for key(s) {', '.join(map(repr, unknown[:10]))}; only a "
                           "post-LN encoder without a pooler, with learned positions, and an 'rtd' or an 'mlm' head "
                           "can be exported")
    if kind == "mlm" and include_tied:
        out[TIED_DECODER_WEIGHT] = out[prefix + _EMBEDDINGS["embeddings.tokens.weight"]]
    return out


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
