"""An lmforge model as a Hugging Face checkpoint: which layout (class family), which class, which tensors.

``export_model(loaded, layout)`` is what ``lmforge convert --to-hf`` writes:

- the **layout**: a decoder is GPT-2, an XLNet is XLNet; an encoder is the layout asked for (``--hf-layout``) or
  the one its config implies (``encoder_layout``: DistilBERT without segments and pooler, ALBERT with a factorised
  embedding or shared layers, ELECTRA in ELECTRA's shape, else BERT). RoBERTa is asked for by name: its body is
  BERT's, only its positions and MLM head differ (``hf_roberta``).
- the **class**: no head -> the bare model; a pretraining head -> the family's pretraining / masked-LM class; a task
  head -> the task class (``hf_tasks``). A task head no class computes is not dropped silently: the backbone is
  written and ``notes`` says why, for the caller to print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lmforge.choices import HF_ENCODER_LAYOUTS
from lmforge.errors import LmforgeError
from lmforge.interop import hf_tasks

__all__ = ["ENCODER_LAYOUTS", "HfExport", "encoder_layout", "export_model", "export_to_hf"]

ENCODER_LAYOUTS = HF_ENCODER_LAYOUTS

# What each encoder layout writes for each pretraining head: {layout: {head type or None: architectures entry}}.
_ENCODER_ARCHITECTURES = {
    # a bare encoder is BertModel: naming a class with heads makes transformers warn that the checkpoint "seems
    # corrupted" and add random heads (issue 23)
    "bert": {None: "BertModel", "pretraining": "BertForPreTraining", "mlm": "BertForMaskedLM"},
    "roberta": {None: "RobertaModel", "mlm": "RobertaForMaskedLM"},
    "albert": {None: "AlbertModel", "pretraining": "AlbertForPreTraining", "mlm": "AlbertForMaskedLM"},
    "distilbert": {None: "DistilBertModel", "mlm": "DistilBertForMaskedLM"},
}
_NAMES = {"bert": "BERT", "roberta": "RoBERTa", "albert": "ALBERT", "distilbert": "DistilBERT", "electra": "ELECTRA"}


@dataclass
class HfExport:
    """What a Hugging Face folder holds: ``config.json``'s dict, the weights (tied repeats included), extra weight
    files (name -> tensors: a token head's CRF), and notes for the person exporting (a head left out, and why)."""

    config: dict[str, Any]
    state: dict[str, Tensor]
    files: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def encoder_layout(config) -> str:
    """The Hugging Face layout an encoder config exports as: "distilbert" (no segment embedding and no pooler),
    "albert" (a factorised embedding or shared layers), else "bert". Each converter then names any option its
    layout cannot express."""
    if config.type_vocab_size == 0 and not config.pooler:
        return "distilbert"
    if config.embedding_size is not None or config.share_layers != "none":
        return "albert"
    return "bert"


def export_to_hf(loaded, layout: str | None = None) -> tuple[dict, dict]:
    """``(config.json dict, state dict)`` of ``export_model``; raises where that would leave a head out."""
    out = export_model(loaded, layout)
    if out.notes:
        raise LmforgeError("; ".join(out.notes))
    return out.config, out.state


def export_model(loaded, layout: str | None = None) -> HfExport:
    """The Hugging Face form of a loaded lmforge model (``config``, ``model``, ``head``).

    Args:
        layout: for an encoder, one of ``ENCODER_LAYOUTS`` (None: the one its config implies).

    Raises:
        LmforgeError: the family has no Hugging Face layout, or the layout cannot express the config (named).
    """
    from lmforge.models import architecture, architectures_with

    config = loaded.config
    family_layout = architecture(config.arch).hf_export
    if family_layout is None:
        exportable = ", ".join(f"{name} as {architecture(name).hf_export}"
                               for name in architectures_with("hf_export"))
        raise LmforgeError(f"exporting a {config.arch!r} model to Hugging Face is not supported (BERT and GPT-2 are: "
                           f"{exportable})")
    if not config.bias or config.ffn != "mlp":
        raise LmforgeError(f"bias={config.bias}, ffn={config.ffn!r}: Hugging Face's {family_layout} layout has biases "
                           "in every projection and a plain feed-forward; this model (Cramming's options) has no "
                           "Hugging Face layout; keep it as an lmforge folder")
    if layout is not None and family_layout != "bert" and layout != family_layout:
        raise LmforgeError(f"--hf-layout {layout}: a {config.arch} model exports as {family_layout} only")
    if layout is not None and family_layout == "bert" and layout not in ENCODER_LAYOUTS:
        raise LmforgeError(f"--hf-layout {layout}: an encoder exports as one of {', '.join(ENCODER_LAYOUTS)}")
    state = loaded.model.state_dict()
    head_type = None if loaded.head is None else loaded.head.get("type")
    if family_layout == "bert":
        layout = layout or config.hf_layout or ("electra" if _exports_as_electra(loaded) else encoder_layout(config))
    else:
        layout = family_layout
    if head_type in hf_tasks.TASK_KINDS:
        return _export_task(loaded, state, layout)
    if head_type is not None and head_type not in ("pretraining", "mlm", "electra", "rtd"):
        enc = _body(state)
        out = _export_bare(loaded, enc, layout)
        out.notes.append(f"transformers has no class for lmforge's {head_type!r} head: the backbone was exported "
                         f"({out.config['architectures'][0]}); keep the lmforge folder to use the head")
        return out
    if layout == "xlnet" and loaded.head is not None:
        raise LmforgeError(f"exporting a {head_type!r} head of an XLNet to Hugging Face is not supported; export "
                           "the backbone (written as XLNetLMHeadModel, with its LM bias)")
    if layout in ("gpt2", "xlnet"):  # their bare export carries the LM head
        return _export_bare(loaded, state, layout)
    if layout == "electra":
        return _export_electra(loaded, state)
    return _export_encoder(loaded, state, layout)


def _body(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A ``TaskModel`` state's backbone entries, without the prefix."""
    return {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}


def _heads(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A ``TaskModel`` state's head entries, without the prefix."""
    return {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}


def _export_bare(loaded, enc: dict[str, Tensor], layout: str) -> HfExport:
    """The backbone alone, as the layout's bare model class."""
    from types import SimpleNamespace

    bare = SimpleNamespace(config=loaded.config, model=None, head=None)
    if layout == "gpt2":
        from lmforge.interop import hf_gpt2

        return HfExport(hf_gpt2.config_to_hf(loaded.config), hf_gpt2.state_dict_to_hf(enc, loaded.config))
    if layout == "xlnet":
        from lmforge.interop import hf_xlnet

        return HfExport(hf_xlnet.config_to_hf(loaded.config), hf_xlnet.state_dict_to_hf(enc))
    if layout == "electra":
        return _export_electra(bare, enc)
    return _export_encoder(bare, enc, layout)


def _export_encoder(loaded, state: dict, layout: str) -> HfExport:
    from lmforge.interop import hf_albert, hf_bert, hf_distilbert, hf_roberta

    config = loaded.config
    head_type = None if loaded.head is None else loaded.head.get("type")
    if head_type not in _ENCODER_ARCHITECTURES[layout]:
        supported = ", ".join(f"{k!r} as {v}" for k, v in _ENCODER_ARCHITECTURES[layout].items() if k)
        raise LmforgeError(f"exporting a {head_type!r} head of a {_NAMES[layout]}-layout encoder to Hugging Face is "
                           f"not supported (heads that are: {supported}); export the backbone")
    _check_layout(config, layout, head_type)
    architecture_name = _ENCODER_ARCHITECTURES[layout][head_type]
    if head_type is None:
        enc, heads = state, None
    else:
        enc, heads = _body(state), _heads(state)
        if head_type == "mlm" and layout in ("bert", "roberta"):  # Bert/RobertaForMaskedLM have no pooler
            enc = {k: v for k, v in enc.items() if not k.startswith("pooler.")}
    if layout == "distilbert":
        return HfExport(hf_distilbert.config_to_hf(config, architecture_name),
                        hf_distilbert.state_dict_to_hf(enc, heads))
    if layout == "albert":
        return HfExport(hf_albert.config_to_hf(config, architecture_name),
                        hf_albert.state_dict_to_hf(enc, heads, share_layers=config.share_layers))
    if layout == "roberta":
        return HfExport(hf_roberta.config_to_hf(config, architecture_name),
                        hf_roberta.state_dict_to_hf(enc, heads, config))
    return HfExport(hf_bert.config_to_hf(config, architecture_name), hf_bert.state_dict_to_hf(enc, heads))


def _check_layout(config, layout: str, head_type: str | None) -> None:
    if layout in ("bert", "roberta") and (config.type_vocab_size == 0 or (not config.pooler and head_type is None)):
        raise LmforgeError(
            f"no Hugging Face layout expresses this encoder (type_vocab_size={config.type_vocab_size}, "
            f"pooler={config.pooler}): BERT and ALBERT need a segment embedding (type_vocab_size >= 1) and a pooler "
            "(ALBERT without one only with an 'mlm' head, as AlbertForMaskedLM), DistilBERT needs "
            "type_vocab_size=0 and pooler=False")


def _exports_as_electra(loaded) -> bool:
    """ELECTRA's heads, or an encoder in ELECTRA's shape: no pooler, a segment embedding, no layer sharing, and no head
    (BERT's and ALBERT's models have a pooler) or an MLM head with GELU (an ELECTRA generator; with another activation
    a factorised encoder keeps exporting as AlbertForMaskedLM, whose MLM transform uses the model's activation)."""
    config = loaded.config
    head_type = None if loaded.head is None else loaded.head.get("type")
    if head_type in ("electra", "rtd"):
        return True
    if head_type in hf_tasks.TASK_KINDS:  # a task head over ELECTRA's shape of encoder
        head_type = None
    return (not config.pooler and config.type_vocab_size >= 1 and config.share_layers == "none"
            and (head_type is None or (head_type == "mlm" and config.activation == "gelu")))


def _export_electra(loaded, state: dict) -> HfExport:
    """An ELECTRA pretraining run exports its discriminator (the backbone and the RTD head) as
    ElectraForPreTraining; the generator is a checkpoint of its own on Hugging Face's side (``lmforge.interop.
    hf_electra.generator_state_dicts``)."""
    from lmforge.interop import hf_electra

    head_type = None if loaded.head is None else loaded.head.get("type")
    if head_type is None:
        return HfExport(hf_electra.config_to_hf(loaded.config, "ElectraModel"), hf_electra.state_dict_to_hf(state))
    enc = _body(state)
    kind = "rtd" if head_type == "electra" else head_type
    heads = {k[len("head."):]: v for k, v in state.items() if k.startswith(f"head.{kind}.")}
    return HfExport(hf_electra.config_to_hf(loaded.config, hf_electra.architecture_of(kind)),
                    hf_electra.state_dict_to_hf(enc, heads))


# ------------------------------------------------------------------------------------------------ task heads
_BARE = {"bert": "BertModel", "roberta": "RobertaModel", "albert": "AlbertModel", "distilbert": "DistilBertModel",
         "electra": "ElectraModel", "xlnet": "XLNetModel", "gpt2": None}


def _body_to_hf(layout: str, enc: dict[str, Tensor], config, *, keep_pooler: bool) -> tuple[dict, dict]:
    """``(config.json dict, state)`` of the body alone under its task-class prefix (``bert.`` ...)."""
    from lmforge.interop import hf_albert, hf_bert, hf_distilbert, hf_electra, hf_gpt2, hf_roberta, hf_xlnet

    if not keep_pooler:
        enc = {k: v for k, v in enc.items() if not k.startswith("pooler.")}
    if layout == "gpt2":
        hf_state = hf_gpt2.state_dict_to_hf({k: v for k, v in enc.items() if not k.startswith("lm_head.")}, config)
        hf_state.pop("lm_head.weight", None)
        return hf_gpt2.config_to_hf(config), hf_state
    if layout == "xlnet":
        body = {k: v for k, v in enc.items() if not k.startswith("lm_head.")}
        return hf_xlnet.config_to_hf(config, "XLNetModel"), hf_xlnet.KEYS.to_hf(body, prefixed=True)
    if layout == "electra":
        return hf_electra.config_to_hf(config, "ElectraModel"), hf_electra.KEYS.to_hf(enc, prefixed=True)
    if layout == "distilbert":
        return hf_distilbert.config_to_hf(config, "DistilBertModel"), hf_distilbert.KEYS.to_hf(enc, prefixed=True)
    if layout == "albert":
        return (hf_albert.config_to_hf(config, "AlbertModel"),
                hf_albert.state_dict_to_hf(enc, None, share_layers=config.share_layers, prefixed=True))
    if layout == "roberta":
        return hf_roberta.config_to_hf(config, "RobertaModel"), hf_roberta.state_dict_to_hf(enc, None, config,
                                                                                              prefixed=True)
    return hf_bert.config_to_hf(config, "BertModel"), hf_bert.KEYS.to_hf(enc, prefixed=True)


def _export_task(loaded, state: dict[str, Tensor], layout: str) -> HfExport:
    """A task head as its transformers class, or the backbone and a note when no class computes it."""
    config = loaded.config
    enc = _body(state)
    head_state = _heads(state)
    if layout in ("bert", "roberta"):
        _check_layout(config, layout, "task")
    try:
        task = hf_tasks.task_head_to_hf(layout, loaded.head, {**head_state, **{k: v for k, v in enc.items()
                                                                               if k.startswith("pooler.")}}, config)
    except hf_tasks.NotExpressible as why:
        out = _export_bare(loaded, enc, layout)
        out.notes.append(f"the {loaded.head.get('type')!r} head has no transformers class ({why}); the backbone was "
                         f"exported as {out.config['architectures'][0]}: keep the lmforge folder to use the head, or "
                         "fine-tune with the options that class computes")
        return out
    hf_config, hf_state = _body_to_hf(layout, enc, config, keep_pooler=task.keep_pooler)
    hf_config = {**hf_config, "architectures": [task.architecture], **task.config}
    files = {hf_tasks.CRF_FILE: task.crf} if task.crf is not None else {}
    notes = []
    if (loaded.head.get("task") or {}).get("input_format") == "gpt":
        notes.append("the model was fine-tuned with GPT-1's input layout ([START] text [EXTRACT], pairs with "
                     "[DELIM]; the tokens are in the exported vocabulary): give transformers its inputs in that layout "
                     "(lmforge predict does)")
    return HfExport(hf_config, {**hf_state, **task.tensors}, files, notes)
