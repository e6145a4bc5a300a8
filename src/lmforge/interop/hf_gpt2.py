"""Hugging Face GPT-2 checkpoints <-> ``lmforge.models.decoder.Decoder``: configs and state dicts.

The only place where GPT-2's names (``wte``, ``c_attn``, ``ln_f`` ...) appear. No import of ``transformers``:
the functions work on plain dicts (a ``config.json`` read with ``json``, a state dict read with ``safetensors`` or
``torch.load``).

GPT-2 stores its projections as ``Conv1D`` with weights (in, out) and computes ``x @ W + b``; our ``nn.Linear``
stores (out, in). Every projection weight is therefore transposed, and the fused ``c_attn`` (D, 3D) is split into
q, k, v along its output columns, in that order.

Key mapping (``h.{l}`` = ``transformer.h.{l}`` in GPT2LMHeadModel, no ``transformer.`` prefix in GPT2Model):
    wte.weight                 -> token_embedding.weight
    wpe.weight                 -> position_embedding.weight
    h.{l}.ln_1.*               -> layers.{l}.self_attn_norm.*
    h.{l}.attn.c_attn.*        -> layers.{l}.self_attn.{q,k,v}_proj.*     (split, transposed)
    h.{l}.attn.c_proj.*        -> layers.{l}.self_attn.out_proj.*         (transposed)
    h.{l}.ln_2.*               -> layers.{l}.ffn_norm.*
    h.{l}.mlp.c_fc.*           -> layers.{l}.ffn.fc1.*                    (transposed)
    h.{l}.mlp.c_proj.*         -> layers.{l}.ffn.fc2.*                    (transposed)
    ln_f.*                     -> final_norm.*
    lm_head.weight             -> lm_head.weight (untied only; dropped when tied to wte)
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch
from torch import Tensor

from lmforge.config import ModelConfig, coerce
from lmforge.errors import LmforgeError
from lmforge.interop.common import ACT_FROM_HF, ACT_TO_HF
from lmforge.interop.keymap import KeyMap, with_leaves

__all__ = ["KEYS", "config_from_hf", "config_to_hf", "state_dict_from_hf", "state_dict_to_hf"]

# GPT2Config defaults, used when a config.json omits a key.
_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5, "initializer_range": 0.02, "tie_word_embeddings": True,
}

# The JSON types of the keys read (a hand-edited config.json is checked before any arithmetic on its values).
_HF_TYPES: dict[str, Any] = {
    "vocab_size": int, "n_positions": int, "n_embd": int, "n_layer": int, "n_head": int, "n_inner": int | None,
    "activation_function": str, "resid_pdrop": float, "embd_pdrop": float, "attn_pdrop": float,
    "layer_norm_epsilon": float, "initializer_range": float, "tie_word_embeddings": bool,
}

_QKV = ("q_proj", "k_proj", "v_proj")  # c_attn's three parts, in its column order
KEYS = KeyMap(
    family="GPT-2",
    checkpoints="a GPT2LMHeadModel or GPT2Model",
    top={"token_embedding.weight": "wte.weight", "position_embedding.weight": "wpe.weight",
         **with_leaves({"final_norm": "ln_f"})},
    hf_layer="h.{i}.",
    # self_attn.{q,k,v}_proj are c_attn, fused: see _split_c_attn / _collect_qkv
    layer=with_leaves({"self_attn_norm": "ln_1", "self_attn.out_proj": "attn.c_proj", "ffn_norm": "ln_2",
                       "ffn.fc1": "mlp.c_fc", "ffn.fc2": "mlp.c_proj"}),
    prefix="transformer.",
    # untied only; a tied head is dropped (see state_dict_from_hf)
    heads={"lm_head.weight": "lm_head.weight"},
    # non-parameter buffers that older checkpoints saved (the causal-mask table and its fill value)
    ignored=("h.{i}.attn.bias", "h.{i}.attn.masked_bias"),
    # quirk: GPT-2's projections are Conv1D, weights (in, out) for x @ W + b; nn.Linear stores (out, in)
    transposed=frozenset({"self_attn.out_proj.weight", "ffn.fc1.weight", "ffn.fc2.weight"}),
)
_OUR_QKV = re.compile(r"self_attn\.([qkv]_proj)\.(weight|bias)")


# ---------------------------------------------------------------------------------------------------------- configs
def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` (arch "decoder", pre-LN, learned positions) from a GPT-2 ``config.json`` dict.

    Args:
        hf: the GPT2Config as a dict (missing keys take GPT2Config's defaults).

    Returns:
        The equivalent ModelConfig. ``dropout`` is ``resid_pdrop`` (also used after the embeddings: a different
        ``embd_pdrop`` is reported with a warning), ``attention_dropout`` is ``attn_pdrop``.

    Raises:
        LmforgeError: not a GPT-2 config, or options we do not implement (naming them).
    """
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise LmforgeError(f"config_from_hf expects a GPT-2 config (model_type 'gpt2'); got {model_type!r}")

    def get(name: str) -> Any:
        key = "n_ctx" if name == "n_positions" and "n_positions" not in hf and "n_ctx" in hf else name  # old configs
        value = hf.get(key)
        return coerce(_HF_DEFAULTS[name] if value is None else value, _HF_TYPES[name], key)

    problems = []
    if hf.get("add_cross_attention"):
        problems.append("add_cross_attention=True (GPT-2 with cross-attention) is not supported")
    if hf.get("scale_attn_weights", True) is False:
        problems.append("scale_attn_weights=False (unscaled attention scores) is not supported")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        problems.append("scale_attn_by_inverse_layer_idx=True is not supported")
    act = get("activation_function")
    if act not in ACT_FROM_HF:
        problems.append(f"activation_function={act!r} is not one of {', '.join(ACT_FROM_HF)}")
    if problems:
        raise LmforgeError("unsupported GPT-2 config: " + "; ".join(problems))
    if get("embd_pdrop") != get("resid_pdrop"):
        warnings.warn(f"GPT-2 embd_pdrop={get('embd_pdrop')} differs from resid_pdrop={get('resid_pdrop')}; "
                      "lmforge uses one dropout for both (resid_pdrop). Inference is unaffected.", stacklevel=2)
    d_model = get("n_embd")
    pad = hf.get("pad_token_id")
    extra = {"pad_token_id": pad} if isinstance(pad, int) and 0 <= pad < get("vocab_size") else {}
    return ModelConfig(
        arch="decoder",
        vocab_size=get("vocab_size"),
        d_model=d_model,
        n_heads=get("n_head"),
        n_layers=get("n_layer"),
        d_ff=get("n_inner") if get("n_inner") is not None else 4 * d_model,
        max_seq_len=get("n_positions"),
        dropout=get("resid_pdrop"),
        attention_dropout=get("attn_pdrop"),
        activation=ACT_FROM_HF[act],
        norm_first=True,
        layer_norm_eps=get("layer_norm_epsilon"),
        positional="learned",
        tie_embeddings=get("tie_word_embeddings"),
        scale_embeddings=False,
        init_std=get("initializer_range"),
        **extra,
    )


def config_to_hf(config: ModelConfig, **extra: Any) -> dict[str, Any]:
    """A GPT2Config dict (``model_type`` "gpt2", ``architectures`` ["GPT2LMHeadModel"]) for a decoder config.

    Args:
        config: a decoder ModelConfig that GPT-2 can express (pre-LN, learned positions, unscaled embeddings).
        **extra: further GPT2Config keys, e.g. ``bos_token_id=50256, eos_token_id=50256`` for the GPT-2
            tokenizer (left unset by default: our config does not know the special tokens).

    Returns:
        A JSON-ready dict; ``transformers.GPT2Config(**d)`` or ``GPT2Config.from_dict(d)`` reads it.

    Raises:
        LmforgeError: naming every option GPT-2 cannot express.
    """
    problems = []
    if config.arch != "decoder":
        problems.append(f"arch={config.arch!r} (GPT-2 is a decoder)")
    if not config.norm_first:
        problems.append("norm_first=False (GPT-2 is pre-LN)")
    if config.positional != "learned":
        problems.append(f"positional={config.positional!r} (GPT-2 has learned positions)")
    if config.scale_embeddings:
        problems.append("scale_embeddings=True (GPT-2 does not scale embeddings)")
    if problems:
        raise LmforgeError("this config cannot be exported as GPT-2: " + "; ".join(problems))
    out: dict[str, Any] = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.max_seq_len,
        "n_embd": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "n_inner": config.d_ff,
        "activation_function": ACT_TO_HF[config.activation],
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.attention_dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": config.init_std,
        "tie_word_embeddings": config.tie_embeddings,
        "scale_attn_weights": True,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    out.update(extra)
    return out


# ---------------------------------------------------------------------------------------------------- state dicts
def _split_c_attn(key: str, value: Tensor) -> dict[str, Tensor] | None:
    """Quirk: GPT-2 fuses q, k and v into one Conv1D, ``c_attn`` (D, 3D): split along its output columns."""
    parsed = KEYS.hf_layer_key(key)
    if parsed is None or parsed[1] not in ("attn.c_attn.weight", "attn.c_attn.bias"):
        return None
    layer, kind = parsed[0], parsed[1].rsplit(".", 1)[1]
    width = value.shape[-1]
    if width % 3:
        raise LmforgeError(f"{key}: fused q/k/v width {width} is not a multiple of 3")
    parts = value.split(width // 3, dim=-1)  # q, k, v: (D, D) each for weights, (D,) for biases
    return {f"layers.{layer}.self_attn.{proj}.{kind}": part.t().contiguous() if kind == "weight" else part.clone()
            for proj, part in zip(_QKV, parts, strict=True)}


def state_dict_from_hf(hf_sd: dict[str, Tensor], config: ModelConfig | None = None) -> dict[str, Tensor]:
    """Convert a GPT2LMHeadModel or GPT2Model state dict to ``Decoder`` keys.

    Args:
        hf_sd: GPT2LMHeadModel keys (``transformer.wte.weight``, ``transformer.h.0.attn.c_attn.weight`` ...,
            ``lm_head.weight``) or GPT2Model keys (no ``transformer.`` prefix). Old causal-mask buffers
            (``attn.bias``, ``attn.masked_bias``) are ignored.
        config: the target model's config, to decide about the LM head: tied -> ``lm_head.weight`` is dropped
            (and must equal ``wte``); untied -> ``lm_head.weight`` is kept (a GPT2Model without a head gets a copy
            of ``wte``). Without a config, ``lm_head.weight`` is kept only when it differs from ``wte``.

    Returns:
        A state dict for ``Decoder.load_state_dict`` (strict).

    Raises:
        LmforgeError: naming any unexpected key, a c_attn whose width is not a multiple of 3, or a head that
            contradicts the config.
    """
    out = KEYS.from_hf(hf_sd, _split_c_attn)
    # quirk: whether the head is tied is the config's to say, not the table's
    lm_head = out.pop("lm_head.weight", None)
    if "token_embedding.weight" not in out:
        raise LmforgeError("the GPT-2 state dict has no token embedding (wte.weight / transformer.wte.weight)")
    wte = out["token_embedding.weight"]
    same_as_wte = lm_head is not None and lm_head.shape == wte.shape and bool(torch.equal(lm_head, wte))
    if config is None:
        if lm_head is not None and not same_as_wte:
            out["lm_head.weight"] = lm_head
    elif config.tie_embeddings:
        if lm_head is not None and not same_as_wte:
            raise LmforgeError("the checkpoint's lm_head.weight differs from wte.weight but the config ties them; "
                               "load it with tie_embeddings=False (tie_word_embeddings false)")
    else:
        out["lm_head.weight"] = wte.clone() if lm_head is None else lm_head
    return out


def state_dict_to_hf(sd: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Convert a ``Decoder`` state dict to GPT2LMHeadModel keys.

    Args:
        sd: ``Decoder.state_dict()``.
        config: its config (must be expressible as GPT-2, see ``config_to_hf``).

    Returns:
        A state dict for ``GPT2LMHeadModel.load_state_dict`` (strict), ``lm_head.weight`` included (a copy of the
        token embedding when tied, as GPT2LMHeadModel's own state dict lists it).

    Raises:
        LmforgeError: naming any key that has no GPT-2 counterpart or a missing q/k/v projection.
    """
    config_to_hf(config)  # raises if GPT-2 cannot express the config
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}  # (layer, weight|bias) -> {q_proj: ...}

    def collect_qkv(key: str, value: Tensor) -> dict[str, Tensor] | None:
        parsed = KEYS.our_layer_key(key)
        proj = None if parsed is None else _OUR_QKV.fullmatch(parsed[1])
        if proj is None:
            return None
        qkv.setdefault((parsed[0], proj.group(2)), {})[proj.group(1)] = value
        return {}  # written fused, below

    out = KEYS.to_hf(sd, prefixed=True, claim=collect_qkv)
    # quirk: q, k and v fused into c_attn (see _split_c_attn)
    for (layer, kind), parts in qkv.items():
        missing = [p for p in _QKV if p not in parts]
        if missing:
            raise LmforgeError(f"layer {layer}: self_attn.{'/'.join(missing)}.{kind} missing; cannot build c_attn")
        if kind == "weight":  # (D, D) each, ours (out, in) -> Conv1D (in, 3 out)
            fused = torch.cat([parts[p].t() for p in _QKV], dim=1)  # (D, 3D)
        else:
            fused = torch.cat([parts[p] for p in _QKV], dim=0)  # (3D,)
        out[KEYS.hf_layer_name(layer, f"attn.c_attn.{kind}", prefixed=True)] = fused.contiguous()
    # GPT2LMHeadModel's state dict always lists the head, tied or not
    wte = KEYS.hf_name("token_embedding.weight", prefixed=True)
    if "lm_head.weight" not in out:
        if wte not in out:
            raise LmforgeError("the state dict has no token_embedding.weight")
        out["lm_head.weight"] = out[wte].clone()
    return out
