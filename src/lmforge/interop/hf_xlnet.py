"""Hugging Face XLNet checkpoints <-> lmforge ``XLNet`` (``lmforge.models.xlnet``).

The only module where Hugging Face's XLNet names appear. Layouts handled (names checked against transformers'
``XLNetModel`` / ``XLNetLMHeadModel`` state dicts):

- ``XLNetModel``: ``word_embedding.weight``, ``mask_emb`` (1, 1, D), ``layer.{l}.rel_attn.*`` (q, k, v, o, r,
  r_w_bias, r_r_bias, r_s_bias, seg_embed, layer_norm), ``layer.{l}.ff.{layer_1,layer_2,layer_norm}.*``; no prefix.
  Our LM bias (``lm_head.bias``) is then absent and a loader keeps it at zero.
- ``XLNetLMHeadModel``: the same under ``transformer.``, plus ``lm_loss.bias`` (ours ``lm_head.bias``) and, in some
  files, ``lm_loss.weight``, which must equal the word embedding (tied; untied heads are refused).

Our parameters carry XLNet's names, so the conversion is a rename: ``layer.`` <-> ``layers.``, ``lm_loss.bias`` <->
``lm_head.bias``. The export always writes the ``XLNetLMHeadModel`` layout (a superset of ``XLNetModel``'s).

Config: ``n_layer``, ``d_model``, ``n_head``, ``d_inner``, ``ff_activation``, ``attn_type``, ``clamp_len`` (-1 = none),
``mem_len`` (None or 0 = keep every state), ``same_length``, ``dropout`` (one rate for everything, ours ``dropout``
and ``attention_dropout``), ``layer_norm_eps``, ``initializer_range``. Not supported: ``bi_data`` (two directions of
encodings per batch), ``reuse_len`` (pretraining's partial memory) and a head size other than d_model / n_head. The
export refuses a pre-LN model (``norm_first``: HF's XLNet is post-LN only), an untied LM head (``tie_embeddings=False``:
HF's ``lm_loss`` is the word embedding) and a bias-free feed-forward (``bias=False``: HF's has biases).

Nothing here imports transformers: configs are plain dicts (``config.json``), state dicts are tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop.common import (
    ACT_TO_HF,
    activation_from_hf,
    check_architecture,
    check_model_type,
    config_reader,
    refuse_export,
)
from lmforge.interop.keymap import KeyMap

__all__ = ["ARCHITECTURES", "KEYS", "PREFIX", "TIED_DECODER_WEIGHT", "config_from_hf", "config_to_hf",
           "state_dict_from_hf", "state_dict_to_hf"]

ARCHITECTURES = ("XLNetModel", "XLNetLMHeadModel")
PREFIX = "transformer."
TIED_DECODER_WEIGHT = "lm_loss.weight"  # the word embedding again (tied)
_TOP = ("word_embedding.weight", "mask_emb")  # same names on both sides
# quirk: the relative-attention parameters (r, r_w_bias, r_r_bias, r_s_bias, seg_embed) are plain tensors, not
# modules: they have no .weight; ours carry XLNet's names, so the layer table is the identity
_ATTN = ("q", "k", "v", "o", "r", "r_w_bias", "r_r_bias", "r_s_bias", "seg_embed", "layer_norm.weight",
         "layer_norm.bias")
_FF = tuple(f"{m}.{p}" for m in ("layer_1", "layer_2", "layer_norm") for p in ("weight", "bias"))
KEYS = KeyMap(
    family="XLNet",
    checkpoints="an XLNetModel or XLNetLMHeadModel",
    top={name: name for name in _TOP},
    hf_layer="layer.{i}.",
    layer={name: name for name in (*(f"rel_attn.{x}" for x in _ATTN), *(f"ff.{x}" for x in _FF))},
    prefix=PREFIX,
    heads={"lm_head.bias": "lm_loss.bias"},
    tied={TIED_DECODER_WEIGHT: "word_embedding.weight"},
    decoder="LM head",
)


# ---------------------------------------------------------------------------------------------- configs
def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` (arch "xlnet") from a Hugging Face XLNet ``config.json`` dict.

    Keys that only concern task heads or generation (``summary_*``, ``start_n_top``, ``use_mems_eval`` ...) are
    ignored. ``max_seq_len`` (XLNet has no position limit) is set to 512, the length the released models were
    trained on, for the data pipelines that read it.

    Raises:
        LmforgeError: a setting our XLNet cannot reproduce (names the key, the value and what is supported).
    """
    check_model_type(hf, "xlnet", "an XLNet checkpoint")
    missing = [k for k in ("vocab_size", "d_model", "n_layer", "n_head") if k not in hf]
    if missing:
        raise LmforgeError(f"XLNet config lacks {', '.join(missing)}")
    get = config_reader(hf)
    d_model, n_head = get("d_model", None), get("n_head", None)
    d_head = get("d_head", None, int | None)
    if n_head < 1 or d_model % n_head or (d_head is not None and d_head != d_model // n_head):
        raise LmforgeError(f"d_head={d_head} with d_model={d_model}, n_head={n_head}: lmforge's XLNet needs "
                           "d_head = d_model / n_head")
    activation = activation_from_hf(hf, "ff_activation", "gelu")
    if get("bi_data", False, bool):
        raise LmforgeError("bi_data=true (forward and backward encodings in each batch, XLNet's pretraining option) "
                           "is not supported; set it to false")
    if get("reuse_len", None, int | None):
        raise LmforgeError("reuse_len (pretraining's partial memory) is not supported; set it to null")
    if not get("tie_word_embeddings", True, bool):
        raise LmforgeError("tie_word_embeddings=false: importing an untied LM head (an lm_loss.weight of its own) "
                           "is not supported")
    attn_type = hf.get("attn_type", "bi")
    if attn_type not in ("bi", "uni"):
        raise LmforgeError(f"attn_type={attn_type!r} is not supported; choose 'bi' or 'uni'")
    clamp_len = get("clamp_len", -1)
    mem_len = get("mem_len", None, int | None)
    dropout = get("dropout", 0.1, float)
    return ModelConfig(
        arch="xlnet",
        vocab_size=get("vocab_size", None),
        d_model=d_model,
        n_heads=n_head,
        n_layers=get("n_layer", None),
        d_ff=get("d_inner", 4 * d_model),
        max_seq_len=512,
        dropout=dropout,
        attention_dropout=dropout,
        activation=activation,
        layer_norm_eps=get("layer_norm_eps", 1e-12, float),
        pad_token_id=get("pad_token_id", None, int | None) or 0,
        init_std=get("initializer_range", 0.02, float),
        attn_type=attn_type,
        mem_len=mem_len if mem_len else None,  # HF: None or 0 keeps every state
        clamp_len=clamp_len if clamp_len > 0 else None,  # HF: -1 (any value <= 0) = no clamping
        same_length=attn_type == "uni" and get("same_length", False, bool),  # HF applies it to "uni" only
    )


def config_to_hf(config: ModelConfig, architecture: str = "XLNetLMHeadModel") -> dict[str, Any]:
    """A Hugging Face ``XLNetConfig`` dict (``config.json``) for ``config``.

    Raises:
        LmforgeError: the config uses something HF's XLNet does not have (names each option).
    """
    check_architecture(architecture, ARCHITECTURES)
    problems = []
    if config.arch != "xlnet":
        problems.append(f"arch={config.arch!r}")
    if config.activation not in ACT_TO_HF:
        problems.append(f"activation={config.activation!r}")
    if config.norm_first:
        problems.append("norm_first=True (HF XLNet is post-LN)")
    if not config.tie_embeddings:
        problems.append("tie_embeddings=False (HF XLNet ties its lm_loss to the word embedding)")
    if not config.bias:
        problems.append("bias=False (HF XLNet's feed-forward has biases)")
    if config.dropout != config.attention_dropout:
        problems.append(f"dropout={config.dropout} differs from attention_dropout={config.attention_dropout} (HF "
                        "XLNet has one rate for both)")
    refuse_export(problems, "XLNet")
    return {
        "architectures": [architecture],
        "model_type": "xlnet",
        "vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "n_layer": config.n_layers,
        "n_head": config.n_heads,
        "d_head": config.d_head,
        "d_inner": config.d_ff,
        "ff_activation": ACT_TO_HF[config.activation],
        "untie_r": True,
        "attn_type": config.attn_type,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.layer_norm_eps,
        "dropout": config.dropout,
        "mem_len": config.mem_len,
        "reuse_len": None,
        "bi_data": False,
        "clamp_len": -1 if config.clamp_len is None else config.clamp_len,
        "same_length": config.same_length,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": True,
    }


# ---------------------------------------------------------------------------------------------- state dicts
def state_dict_from_hf(hf_sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename a Hugging Face XLNet state dict (``XLNetModel``, or ``XLNetLMHeadModel`` with ``transformer.``) to
    ours. Tensors are shared, not copied.

    Raises:
        LmforgeError: an unexpected key (named), or an ``lm_loss.weight`` that differs from the word embedding.
    """
    return KEYS.from_hf(hf_sd)


def state_dict_to_hf(state: Mapping[str, Tensor], *, include_tied: bool = False) -> dict[str, Tensor]:
    """Our ``XLNet`` state dict as an ``XLNetLMHeadModel`` one.

    Args:
        include_tied: also write ``lm_loss.weight`` (= the word embedding), as ``XLNetLMHeadModel.state_dict()``
            has it (leave it out before ``safetensors.torch.save_file``: it shares memory with another entry).

    Raises:
        LmforgeError: a key with no XLNet name (named).
    """
    return KEYS.to_hf(state, prefixed=True, include_tied=include_tied)
