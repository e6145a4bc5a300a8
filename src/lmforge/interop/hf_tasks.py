"""Hugging Face task models <-> lmforge task heads, for every family lmforge reads and writes.

transformers puts a small head over a family's body for each fine-tuning task (``BertForSequenceClassification``,
``RobertaForTokenClassification``, ``XLNetForQuestionAnsweringSimple`` ...). Each is one of lmforge's heads with
some options set, and this module says which, once per family, as tables (``TASK_HEADS``):

============  ===========================================  ===========================================
family        sequence / multiple choice                    token / QA
============  ===========================================  ===========================================
BERT, ALBERT  the body's pooler, then ``classifier``         ``classifier`` / ``qa_outputs`` (no pooler)
RoBERTa       sequence: dense + tanh over ``<s>`` (no        as BERT
              pooler); choice: the pooler, as BERT
DistilBERT    ``pre_classifier`` + ReLU over [CLS]           as BERT
ELECTRA       dense + GELU over [CLS] (``classifier.dense``  as BERT
              / ``sequence_summary``)
XLNet         ``sequence_summary`` + tanh over the last      as BERT (``ForQuestionAnsweringSimple``)
              token, then ``logits_proj``
GPT-2         ``score`` (no bias) at the last real token     as BERT (no multiple choice class)
============  ===========================================  ===========================================

The labels travel as ``id2label`` / ``label2id`` (and ``problem_type`` "regression" for a one-output sequence
head). What transformers has no place for is written beside it, never dropped: a token head's CRF
(``crf.safetensors``, named in ``config.json`` under ``lmforge_crf``), and the whole head description under
``lmforge_head``, so that lmforge reads back exactly the head it wrote (its task settings included) while
transformers ignores the key. A head no transformers class computes (mean pooling, GPT-1's symmetric pairs, a BERT
head without the pooler ...) raises ``NotExpressible``: the caller exports the backbone and says why.
Nothing here imports transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.interop.keymap import with_leaves

__all__ = ["CLASS_PREFIX", "CRF_FILE", "CRF_KEY", "HEAD_KEY", "NotExpressible", "TASK_HEADS", "TASK_KINDS", "TaskHead",
           "TaskExport", "find_task_head", "labels_from_hf", "split_task_head", "task_head_to_hf"]

SEQUENCE, TOKEN, QA, CHOICE = "sequence_classification", "token_classification", "qa", "multiple_choice"
TASK_KINDS = (SEQUENCE, TOKEN, QA, CHOICE)
CRF_FILE = "crf.safetensors"  # a token head's CRF, beside model.safetensors
CRF_KEY = "lmforge_crf"  # config.json: {"file": CRF_FILE, "scheme": ...}
HEAD_KEY = "lmforge_head"  # config.json: the lmforge head description, read back by lmforge only
_CRF_PARAMS = ("crf.start", "crf.transitions", "crf.end")

CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "distilbert": "DistilBert",
                "electra": "Electra", "xlnet": "XLNet", "gpt2": "GPT2"}


class NotExpressible(LmforgeError):
    """The head has no Hugging Face class that computes it; the message says why."""


@dataclass(frozen=True)
class TaskHead:
    """One transformers task class of a family, as an lmforge head.

    Attributes:
        kind: our head type (``"sequence_classification"`` ...).
        suffix: the class name after the family's prefix (``"ForSequenceClassification"``).
        keys: our head's state-dict key -> transformers' (top level, outside the body).
        options: the head options the class implies (``hidden="tanh"``, ``bias=False``); absent ones are at their
            defaults.
        pooler: True: the class has the body's pooler and its head reads it; False: the class has no pooler (a
            sequence or choice head then reads the first token's state: our encoder with ``pooler=False``); None:
            the family has no pooler (XLNet, GPT-2).
        fold_pooler: export only: our body's pooler is written as the head's first dense layer (RoBERTa's
            classification head is a dense layer with tanh over ``<s>``: our pooler exactly).
    """

    kind: str
    suffix: str
    keys: Mapping[str, str]
    options: Mapping[str, Any] = field(default_factory=dict)
    pooler: bool | None = False
    fold_pooler: bool = False


def _linear(ours: str, theirs: str, *, bias: bool = True) -> dict[str, str]:
    return with_leaves({ours: theirs}, ("weight", "bias") if bias else ("weight",))


_TOKEN_HEAD = TaskHead(TOKEN, "ForTokenClassification", _linear("classifier", "classifier"))
_QA_HEAD = TaskHead(QA, "ForQuestionAnswering", _linear("qa_outputs", "qa_outputs"))
_BERT_HEADS = (
    TaskHead(SEQUENCE, "ForSequenceClassification", _linear("classifier", "classifier"), pooler=True),
    _TOKEN_HEAD, _QA_HEAD,
    TaskHead(CHOICE, "ForMultipleChoice", _linear("scorer", "classifier"), pooler=True),
)
TASK_HEADS: Mapping[str, tuple[TaskHead, ...]] = {
    "bert": _BERT_HEADS,
    "albert": _BERT_HEADS,
    "roberta": (
        TaskHead(SEQUENCE, "ForSequenceClassification",
                 {**_linear("dense", "classifier.dense"), **_linear("classifier", "classifier.out_proj")},
                 {"hidden": "tanh"}),
        TaskHead(SEQUENCE, "ForSequenceClassification", _linear("classifier", "classifier.out_proj"),
                 pooler=True, fold_pooler=True),
        _TOKEN_HEAD, _QA_HEAD,
        TaskHead(CHOICE, "ForMultipleChoice", _linear("scorer", "classifier"), pooler=True),
    ),
    "distilbert": (
        TaskHead(SEQUENCE, "ForSequenceClassification",
                 {**_linear("dense", "pre_classifier"), **_linear("classifier", "classifier")}, {"hidden": "relu"}),
        _TOKEN_HEAD, _QA_HEAD,
        TaskHead(CHOICE, "ForMultipleChoice",
                 {**_linear("dense", "pre_classifier"), **_linear("scorer", "classifier")}, {"hidden": "relu"}),
    ),
    "electra": (
        TaskHead(SEQUENCE, "ForSequenceClassification",
                 {**_linear("dense", "classifier.dense"), **_linear("classifier", "classifier.out_proj")},
                 {"hidden": "gelu"}),
        _TOKEN_HEAD, _QA_HEAD,
        TaskHead(CHOICE, "ForMultipleChoice",
                 {**_linear("dense", "sequence_summary.summary"), **_linear("scorer", "classifier")},
                 {"hidden": "gelu"}),
    ),
    "xlnet": (
        TaskHead(SEQUENCE, "ForSequenceClassification",
                 {**_linear("dense", "sequence_summary.summary"), **_linear("classifier", "logits_proj")},
                 {"hidden": "tanh"}, pooler=None),
        TaskHead(TOKEN, "ForTokenClassification", _linear("classifier", "classifier"), pooler=None),
        TaskHead(QA, "ForQuestionAnsweringSimple", _linear("qa_outputs", "qa_outputs"), pooler=None),
        TaskHead(CHOICE, "ForMultipleChoice",
                 {**_linear("dense", "sequence_summary.summary"), **_linear("scorer", "logits_proj")},
                 {"hidden": "tanh"}, pooler=None),
    ),
    "gpt2": (
        TaskHead(SEQUENCE, "ForSequenceClassification", _linear("classifier", "score", bias=False),
                 {"bias": False}, pooler=None),
        TaskHead(TOKEN, "ForTokenClassification", _linear("classifier", "classifier"), pooler=None),
        TaskHead(QA, "ForQuestionAnswering", _linear("qa_outputs", "qa_outputs"), pooler=None),
    ),
}
# XLNet's and ELECTRA's multiple-choice / sequence summaries: (config key, the value our head computes)
_SUMMARIES = {
    ("xlnet", SEQUENCE): {"summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh"},
    ("xlnet", CHOICE): {"summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh"},
    ("electra", CHOICE): {"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu"},
}
# the config key of the head's dropout, by family and head (transformers' names)
_DROPOUT_KEYS = {
    "bert": {SEQUENCE: "classifier_dropout", TOKEN: "classifier_dropout", CHOICE: "classifier_dropout"},
    "roberta": {SEQUENCE: "classifier_dropout", TOKEN: "classifier_dropout", CHOICE: "classifier_dropout"},
    "electra": {SEQUENCE: "classifier_dropout", TOKEN: "classifier_dropout"},
    "albert": {SEQUENCE: "classifier_dropout_prob", TOKEN: "classifier_dropout_prob",
               CHOICE: "classifier_dropout_prob"},
    "distilbert": {SEQUENCE: "seq_classif_dropout", CHOICE: "seq_classif_dropout", QA: "qa_dropout"},
    "xlnet": {SEQUENCE: "summary_last_dropout", CHOICE: "summary_last_dropout"},
    "gpt2": {TOKEN: "classifier_dropout"},
}


def _architecture(hf: Mapping[str, Any]) -> str | None:
    names = hf.get("architectures")
    return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None


def find_task_head(hf: Mapping[str, Any]) -> TaskHead | None:
    """The task head of a Hugging Face ``config.json`` (by its ``architectures`` entry), or None (a bare model or a
    pretraining class)."""
    model_type = hf.get("model_type")
    architecture = _architecture(hf)
    for head in TASK_HEADS.get(model_type, ()):
        if not head.fold_pooler and CLASS_PREFIX[model_type] + head.suffix == architecture:
            return head
    return None


def labels_from_hf(hf: Mapping[str, Any], kind: str) -> tuple[list[str], bool]:
    """``(labels in id order, regression)`` of a task config: ``id2label`` when it has one, else transformers'
    default names ``LABEL_0`` ... for ``num_labels`` (2 by default).

    Raises:
        LmforgeError: multi-label classification (one sigmoid per label, which lmforge's heads do not train), or an
            ``id2label`` with gaps in its ids.
    """
    id2label = hf.get("id2label")
    if isinstance(id2label, Mapping) and id2label:
        table = {str(k): str(v) for k, v in id2label.items()}
        missing = [str(i) for i in range(len(table)) if str(i) not in table]
        if missing:
            raise LmforgeError(f"id2label has no label for id(s) {', '.join(missing[:5])}: the ids must be 0 .. "
                               f"{len(table) - 1}")
        labels = [table[str(i)] for i in range(len(table))]
    else:
        n = hf.get("num_labels", 2)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise LmforgeError(f"num_labels={n!r} must be a positive integer")
        labels = [f"LABEL_{i}" for i in range(n)]
    problem = hf.get("problem_type")
    if problem == "multi_label_classification":
        raise LmforgeError("problem_type='multi_label_classification' (one sigmoid per label): lmforge's sequence "
                           "head picks one label per text; fine-tune the backbone on single-label data instead")
    regression = kind == SEQUENCE and (problem == "regression" or (problem is None and len(labels) == 1))
    return labels, regression


def _check_summary(hf: Mapping[str, Any], model_type: str, kind: str) -> None:
    for key, value in _SUMMARIES.get((model_type, kind), {}).items():
        if hf.get(key, value) != value:
            raise LmforgeError(f"{key}={hf.get(key)!r}: lmforge reads this {CLASS_PREFIX[model_type]} head with "
                               f"{key}={value!r} only (transformers' default)")


def split_task_head(tensors: Mapping[str, Tensor], hf: Mapping[str, Any], crf: Mapping[str, Tensor] | None = None
                    ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None, dict[str, Any] | None, TaskHead | None]:
    """Take a task model's head out of a Hugging Face state dict.

    Args:
        tensors: the checkpoint's tensors.
        hf: its ``config.json`` (``model_type``, ``architectures``, the labels).
        crf: the tensors of ``crf.safetensors`` when the folder has one (a token head exported by lmforge).

    Returns:
        ``(body, head_state, head_spec, task_head)``: the tensors without the head's (Hugging Face names, for the
        family's converter), our head's state dict and description, and the class's table entry; the last three
        None when the config names no task class.

    Raises:
        LmforgeError: head weights missing, head-like weights under a class that has none, or settings lmforge's
            head cannot reproduce (named).
    """
    model_type = hf.get("model_type")
    head = find_task_head(hf)
    if head is None:
        theirs = {k for h in TASK_HEADS.get(model_type, ()) for k in h.keys.values()}
        stray = sorted(k for k in tensors if k in theirs)
        if stray:
            prefix = CLASS_PREFIX[model_type]
            classes = ", ".join(prefix + h.suffix for h in TASK_HEADS[model_type] if not h.fold_pooler)
            raise LmforgeError(f"the checkpoint holds task-head weights ({', '.join(stray[:4])}) but config.json names "
                               f"architectures={hf.get('architectures')!r}; set it to the class the model was saved "
                               f"from (one of {classes})")
        return dict(tensors), None, None, None
    missing = [k for k in head.keys.values() if k not in tensors]
    if missing:
        raise LmforgeError(f"a {CLASS_PREFIX[model_type]}{head.suffix} checkpoint without {', '.join(missing)}")
    _check_summary(hf, model_type, head.kind)
    taken = set(head.keys.values())
    body = {k: v for k, v in tensors.items() if k not in taken}
    state = {ours: tensors[theirs] for ours, theirs in head.keys.items()}
    spec = _spec_from_hf(hf, head, model_type)
    if crf is not None and head.kind == TOKEN:
        absent = [k for k in _CRF_PARAMS if k not in crf]
        if absent:
            raise LmforgeError(f"{CRF_FILE} lacks {', '.join(absent)}")
        state.update({k: crf[k] for k in _CRF_PARAMS})
        spec["crf"] = True
        scheme = (hf.get(CRF_KEY) or {}).get("scheme")
        if scheme is not None:
            spec["scheme"] = scheme
    return body, state, spec, head


def _spec_from_hf(hf: Mapping[str, Any], head: TaskHead, model_type: str) -> dict[str, Any]:
    """Our head description: lmforge's own (``lmforge_head``) when it wrote this folder and it is this kind of head,
    else the class's options, the labels and the dropout."""
    own = hf.get(HEAD_KEY)
    if isinstance(own, Mapping) and own.get("type") == head.kind:
        spec = dict(own)
        if head.kind in (SEQUENCE, TOKEN) and hf.get("id2label") and not spec.get("regression"):
            spec["labels"] = labels_from_hf(hf, head.kind)[0]  # the labels transformers trained last win
        return spec
    spec = {"type": head.kind, **head.options}
    if head.kind in (SEQUENCE, TOKEN):
        labels, regression = labels_from_hf(hf, head.kind)
        spec["labels"] = labels
        if regression:
            spec["regression"] = True
    dropout_key = _DROPOUT_KEYS.get(model_type, {}).get(head.kind)
    dropout = None if dropout_key is None else hf.get(dropout_key)
    if isinstance(dropout, (int, float)) and not isinstance(dropout, bool) and 0.0 <= dropout < 1.0:
        spec["dropout"] = float(dropout)
    return spec


@dataclass
class TaskExport:
    """A head as transformers stores it: the class name, the head's tensors (top level; a folded pooler among them),
    the keys to add to ``config.json``, the CRF's tensors for ``crf.safetensors`` (None without a CRF), and whether
    the body's pooler stays under the body (False: drop it)."""

    architecture: str
    tensors: dict[str, Tensor]
    config: dict[str, Any]
    crf: dict[str, Tensor] | None
    keep_pooler: bool


def _expresses(head: TaskHead, spec: Mapping[str, Any], config: ModelConfig) -> str | None:
    """Why ``head`` does not compute what ``spec`` describes over ``config``'s body (None: it does)."""
    if head.kind != spec.get("type"):
        return "another head type"
    if head.kind in (SEQUENCE, CHOICE):
        for option, default in (("hidden", None), ("bias", True)):
            if spec.get(option, default) != head.options.get(option, default):
                return f"{option}={spec.get(option, default)!r} (the class has {head.options.get(option, default)!r})"
        if spec.get("pooling", "cls") != "cls":
            return f"pooling={spec.get('pooling')!r} (transformers' heads read one token's state)"
        if spec.get("combine_windows", "mean_logits") != "mean_logits":
            return "symmetric pairs (GPT-1's two orders of a pair, added)"
        if head.pooler is not None and bool(config.pooler) != head.pooler:
            return (f"pooler={config.pooler} (the class reads " + ("the pooler" if head.pooler else
                                                                   "the first token's state without a pooler") + ")")
    return None


def task_head_to_hf(model_type: str, spec: Mapping[str, Any], state: Mapping[str, Tensor], config: ModelConfig
                    ) -> TaskExport:
    """The transformers form of an lmforge task head over a body exported as ``model_type``.

    Args:
        spec: the head's description (``config.json``'s ``head``).
        state: the head's state dict (no ``head.`` prefix) and, for a folded pooler, the body's ``pooler.*``.
        config: the body's config.

    Raises:
        NotExpressible: no class of the family computes this head (the reasons, one per candidate class).
    """
    kind = spec.get("type")
    candidates = [h for h in TASK_HEADS.get(model_type, ()) if h.kind == kind]
    family = CLASS_PREFIX.get(model_type, model_type)
    if not candidates:
        raise NotExpressible(f"transformers has no {family} class for a {kind!r} head")
    reasons = []
    for head in candidates:
        why = _expresses(head, spec, config)
        if why is not None:
            reasons.append(f"{family}{head.suffix}: {why}")
            continue
        tensors = {}
        for ours, theirs in head.keys.items():
            tensors[theirs] = state[ours]
        if head.fold_pooler:
            tensors["classifier.dense.weight"] = state["pooler.dense.weight"]
            tensors["classifier.dense.bias"] = state["pooler.dense.bias"]
        extra = _config_to_hf(spec, head, model_type, config)
        crf = None
        if kind == TOKEN and spec.get("crf"):
            crf = {k: state[k] for k in _CRF_PARAMS}
            extra[CRF_KEY] = {"file": CRF_FILE, "scheme": spec.get("scheme", "BIO"),
                              "note": "lmforge's CRF over the word sequence; transformers reads the softmax tagger "
                                      "alone (the emissions), lmforge reads both"}
        return TaskExport(family + head.suffix, tensors, extra, crf,
                          keep_pooler=bool(head.pooler) and not head.fold_pooler)
    raise NotExpressible("; ".join(reasons))


def _config_to_hf(spec: Mapping[str, Any], head: TaskHead, model_type: str, config: ModelConfig) -> dict[str, Any]:
    extra: dict[str, Any] = {HEAD_KEY: dict(spec)}
    labels = spec.get("labels")
    if labels is not None and head.kind in (SEQUENCE, TOKEN):
        labels = [str(x) for x in labels]
        if spec.get("regression"):
            labels = labels[:1] or ["LABEL_0"]
        extra["id2label"] = {str(i): label for i, label in enumerate(labels)}
        extra["label2id"] = {label: i for i, label in enumerate(labels)}
        if head.kind == SEQUENCE:
            extra["problem_type"] = "regression" if spec.get("regression") else "single_label_classification"
    extra.update(_SUMMARIES.get((model_type, head.kind), {}))
    dropout_key = _DROPOUT_KEYS.get(model_type, {}).get(head.kind)
    if dropout_key is not None and spec.get("dropout") is not None:
        extra[dropout_key] = spec["dropout"]
    if model_type == "gpt2" and head.kind == SEQUENCE:  # the last real token is found by the padding id
        extra["pad_token_id"] = config.pad_token_id
    return extra
