"""The Hugging Face formats lmforge reads, by ``model_type``: one lookup instead of an if/elif per family.

``hf_format(model_type)`` gives a ``HfFormat`` record whose functions turn a Hugging Face ``config.json`` dict into a
``ModelConfig`` and a Hugging Face state dict into what a loader builds and loads: our state dict (a ``TaskModel``'s,
``backbone.*`` / ``head.*``, when the checkpoint has heads and they are wanted), the head's description, and the
key prefixes the checkpoint may lack (modules its class does not have, which keep their initialisation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop import hf_albert, hf_bert, hf_distilbert, hf_electra, hf_gpt2, hf_roberta, hf_tasks, hf_xlnet

__all__ = ["HF_FORMATS", "HfFormat", "LoadedState", "hf_format", "state_from_hf"]

# (our state dict, the head's description or None, prefixes of keys the checkpoint may lack)
LoadedState = tuple[dict[str, Tensor], dict[str, Any] | None, tuple[str, ...]]


@dataclass(frozen=True)
class HfFormat:
    """One Hugging Face family as a loader sees it.

    Attributes:
        model_type: the ``config.json`` ``model_type`` ("bert").
        config_from_hf: ``config.json`` dict -> ``ModelConfig`` (raises ``LmforgeError`` naming what it cannot read).
        state_from_hf: ``(tensors, with_head, config) -> (state, head, optional)``: ``state`` is the backbone's
            state dict, or a ``TaskModel``'s (``backbone.*`` / ``head.*``) when the checkpoint has heads and
            ``with_head``; ``head`` the head's description for ``build_head`` (None without); ``optional`` the key
            prefixes (of ``state``) the checkpoint may lack.
        compared_repeats: tied repeats the conversion compares by value (a tied decoder); a shape-only pass over
            meta tensors leaves them out of the tensors it converts.
        untied_head: key prefixes (of our state) an untied model needs and the shape-only pass does not produce
            (GPT-2's ``lm_head.``: the conversion keeps the head only when its values differ from the embedding).
    """

    model_type: str
    config_from_hf: Callable[[Mapping[str, Any]], ModelConfig]
    state_from_hf: Callable[[Mapping[str, Tensor], bool, ModelConfig], LoadedState]
    compared_repeats: tuple[str, ...] = ()
    untied_head: tuple[str, ...] = ()


def _task_state(encoder_sd: dict[str, Tensor], heads_sd: dict[str, Tensor] | None, head: dict[str, Any],
                optional: tuple[str, ...], with_head: bool) -> LoadedState:
    """An encoder family's result: the ``TaskModel`` state with ``head`` when there are heads and they are wanted,
    else the encoder's own state (and the optional prefixes that are the encoder's, without ``backbone.``)."""
    if heads_sd is None or not with_head:
        return encoder_sd, None, tuple(p[len("backbone."):] for p in optional if p.startswith("backbone."))
    state = {**{f"backbone.{k}": v for k, v in encoder_sd.items()}, **{f"head.{k}": v for k, v in heads_sd.items()}}
    return state, head, optional


# BertForMaskedLM / AlbertForMaskedLM have no pooler and no NSP / SOP classifier: those start fresh.
_PRETRAINING_OPTIONAL = ("backbone.pooler.", "head.nsp.")


def _bert_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    encoder_sd, heads_sd = hf_bert.state_dict_from_hf(tensors)
    if heads_sd is not None and not any(k.startswith("nsp.") for k in heads_sd):  # BertForMaskedLM: MLM alone
        return _task_state(encoder_sd, heads_sd, {"type": "mlm"}, ("backbone.pooler.",), with_head)
    return _task_state(encoder_sd, heads_sd, {"type": "pretraining"}, _PRETRAINING_OPTIONAL, with_head)


def _roberta_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    encoder_sd, heads_sd = hf_roberta.state_dict_from_hf(tensors, config)
    # RobertaForMaskedLM has no pooler: it starts fresh
    return _task_state(encoder_sd, heads_sd, {"type": "mlm"}, ("backbone.pooler.",), with_head)


def _albert_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    encoder_sd, heads_sd = hf_albert.state_dict_from_hf(tensors, config)
    return _task_state(encoder_sd, heads_sd, {"type": "pretraining"}, _PRETRAINING_OPTIONAL, with_head)  # SOP = NSP


def _distilbert_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    encoder_sd, heads_sd = hf_distilbert.state_dict_from_hf(tensors)  # no pooler, MLM heads only: none optional
    return _task_state(encoder_sd, heads_sd, {"type": "mlm"}, (), with_head)


def _electra_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    # ElectraModel: no head; ElectraForPreTraining: head "rtd"; ElectraForMaskedLM: head "mlm"
    encoder_sd, heads_sd, kind = hf_electra.state_dict_from_hf(tensors, config)
    return _task_state(encoder_sd, heads_sd, {"type": kind}, (), with_head)


def _gpt2_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    # the config says whether the head is tied: an untied head equal to wte (a fresh copy) is kept, not dropped
    return hf_gpt2.state_dict_from_hf(tensors, config), None, ()


def _xlnet_state(tensors: Mapping[str, Tensor], with_head: bool, config: ModelConfig) -> LoadedState:
    return hf_xlnet.state_dict_from_hf(tensors), None, ("lm_head.",)  # XLNetModel has no LM bias: ours starts at 0


HF_FORMATS: Mapping[str, HfFormat] = {fmt.model_type: fmt for fmt in (
    HfFormat("bert", hf_bert.config_from_hf, _bert_state, hf_bert.KEYS.compared_repeats),
    HfFormat("roberta", hf_roberta.config_from_hf, _roberta_state, hf_roberta.KEYS.compared_repeats),
    HfFormat("albert", hf_albert.config_from_hf, _albert_state, hf_albert.KEYS.compared_repeats),
    HfFormat("distilbert", hf_distilbert.config_from_hf, _distilbert_state, hf_distilbert.KEYS.compared_repeats),
    HfFormat("gpt2", hf_gpt2.config_from_hf, _gpt2_state, ("lm_head.weight",), untied_head=("lm_head.",)),
    HfFormat("xlnet", hf_xlnet.config_from_hf, _xlnet_state, hf_xlnet.KEYS.compared_repeats),
    HfFormat("electra", hf_electra.config_from_hf, _electra_state, hf_electra.KEYS.compared_repeats),
)}


def hf_format(model_type: str) -> HfFormat:
    """The format of a Hugging Face ``config.json`` ``model_type``.

    Raises:
        LmforgeError: a ``model_type`` lmforge does not read (naming those it does).
    """
    if model_type not in HF_FORMATS:
        raise LmforgeError(f"a Hugging Face {model_type!r:.40} checkpoint; lmforge reads model_type "
                           f"{', '.join(repr(t) for t in HF_FORMATS)}")
    return HF_FORMATS[model_type]


# the fine-tuning task of each task head transformers has a class for
_TASK_OF = {hf_tasks.SEQUENCE: "sequence", hf_tasks.TOKEN: "token", hf_tasks.QA: "qa", hf_tasks.CHOICE: "choice"}


def state_from_hf(fmt: HfFormat, tensors: Mapping[str, Tensor], hf: Mapping[str, Any], with_head: bool,
                  config: ModelConfig, crf: Mapping[str, Tensor] | None = None) -> LoadedState:
    """``fmt.state_from_hf`` for any class of the family, task models included: a task head
    (``BertForSequenceClassification`` ...) is taken out first (``hf_tasks.split_task_head``) and becomes our head
    (with ``with_head``; dropped without), the rest is the family's body.

    Args:
        hf: the checkpoint's ``config.json`` (its class and labels).
        crf: the tensors of the folder's ``crf.safetensors``, when it has one.
    """
    body, head_state, spec, task = hf_tasks.split_task_head(tensors, hf, crf)
    if spec is None:
        return fmt.state_from_hf(body, with_head, config)
    encoder_sd, _, optional = fmt.state_from_hf(body, False, config)
    if not with_head:
        return encoder_sd, None, optional
    if "task" not in spec:  # how predict / evaluate read text for it: the task of the head, at the model's length
        spec = {**spec, "task": {"task": _TASK_OF[spec["type"]], "max_length": min(128, config.max_seq_len),
                                 **({"crf": True, "scheme": spec.get("scheme", "BIO")} if spec.get("crf") else {})}}
    # a class without the pooler (token, QA) over an encoder that has one: the pooler starts fresh
    fresh = ("backbone.pooler.",) if task.pooler is False and getattr(config, "pooler", False) else ()
    state = {**{f"backbone.{k}": v for k, v in encoder_sd.items()}, **{f"head.{k}": v for k, v in head_state.items()}}
    return state, spec, tuple(f"backbone.{p}" for p in optional) + fresh
