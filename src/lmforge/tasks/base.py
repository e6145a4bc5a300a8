"""What every fine-tuning task shares: the ``Task`` interface, the feature dataset and the objective.

A task turns a user's file into examples (``read``), examples into model features (``featurize``: lists of
ids, one or more features per example), features into padded tensors (``collate``), runs the model over features
(``predict``: one decoded prediction per example), scores predictions (``metrics``) and writes them as JSON
(``record``). Its ``head_spec`` describes the head it needs, with the task's own settings and labels under the
``task`` key, so a saved model folder knows how to read and featurize new inputs (``lmforge predict``,
``lmforge evaluate``, the pipelines).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.config import TaskConfig, from_dict, to_dict
from lmforge.data.batches import FeatureData, feature_length  # noqa: F401  (FeatureData re-exported: lmforge.tasks)
from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput

log = logging.getLogger("lmforge")

Feature = dict[str, Any]


# TaskConfig fields every task reads; fields only the training run reads (never saved with the model)
COMMON_OPTIONS = ("task", "max_length", "dropout", "metric", "input_format")
TRAINING_OPTIONS = ("freeze", "reinit_layers", "head_lr", "layer_decay", "gradual_unfreezing", "epochs",
                    "init_embeddings", "lm_weight")


class Task:
    """Base class of the fine-tuning tasks; subclasses fill in the data and decoding steps.

    Attributes:
        config: the TaskConfig.
        labels: the label names, fixed from the training data (``fit_labels``) or read from a saved model.
        head_type: the ``lmforge.heads`` builder name.
        loss_name: the loss term's name in the logs.
        options: the TaskConfig fields this task reads besides ``COMMON_OPTIONS`` and ``TRAINING_OPTIONS``.
    """

    head_type = ""
    options: tuple[str, ...] = ()
    loss_name = "task"
    default_metric = "f1"

    def __init__(self, config: TaskConfig, labels: Sequence[str] | None = None) -> None:
        self.config = config
        self.labels: list[str] = list(labels or [])

    # ---------------------------------------------------------------------------------------- description
    def head_options(self) -> dict[str, Any]:
        """Builder options of the head (JSON-plain)."""
        return {"labels": self.labels}

    def head_spec(self) -> dict[str, Any]:
        """The head description saved in a model's config.json: the builder, its options and labels, and the task
        settings needed to read and featurize new inputs (the training-only ones are not saved)."""
        kept = (*COMMON_OPTIONS, *self.options)
        return {"type": self.head_type, **self.head_options(),
                "task": {k: v for k, v in to_dict(self.config).items() if k in kept}}

    def check_options(self) -> None:
        """Refuse a setting this task does not read (e.g. ``crf`` on a QA task), naming the task's own options.

        Raises:
            LmforgeError: a field outside this task's options that differs from its default.
        """
        default = to_dict(TaskConfig(task=self.config.task))
        allowed = {*COMMON_OPTIONS, *TRAINING_OPTIONS, *self.options}
        stray = [f"{k}={v!r}" for k, v in to_dict(self.config).items() if k not in allowed and v != default[k]]
        if stray:
            raise LmforgeError(f"{', '.join(stray)}: not an option of task {self.config.task!r}; its options are "
                               f"{', '.join(self.options) or 'none'} (and for every task: "
                               f"{', '.join(COMMON_OPTIONS[1:] + TRAINING_OPTIONS)})")

    @classmethod
    def from_head_spec(cls, spec: dict[str, Any]) -> Task:
        config = from_dict(TaskConfig, spec.get("task") or {}, where="the model's config.json: head.task")
        return cls(config, spec.get("labels"))

    @property
    def metric(self) -> str:
        return self.config.metric or self.default_metric

    # ---------------------------------------------------------------------------------------- data
    def read(self, path: str, *, labelled: bool = True) -> list[Any]:
        raise NotImplementedError

    def fit_labels(self, examples: list[Any]) -> None:
        """Fix the label set from the training examples."""
        raise NotImplementedError

    def featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        """Model features of ``examples``: the task's own layout (``_featurize``, BERT's), mapped to GPT-1's
        ``[START] .. [DELIM] .. [EXTRACT]`` when ``input_format`` is "gpt" (``lmforge.tasks.gpt_inputs``)."""
        features = self._featurize(examples, tokenizer, training=training)
        if self.config.input_format == "gpt":
            from lmforge.tasks.gpt_inputs import apply_gpt_layout

            apply_gpt_layout(features, tokenizer)
        return features

    def _featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        raise NotImplementedError

    def collate(self, features: list[Feature], pad_id: int) -> dict[str, Tensor]:
        raise NotImplementedError

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        """Items the loss is summed over, read from the batch (see ``lmforge.objectives.base``)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- outputs
    def predict(self, model: nn.Module, examples: list[Any], features: list[Feature], tokenizer: Any, *,
                batch_size: int = 32, progress: str | None = None) -> list[Any]:
        """One decoded prediction per example; ``progress`` labels a progress bar (None: none)."""
        raise NotImplementedError

    def metrics(self, examples: list[Any], predictions: list[Any]) -> dict[str, float]:
        raise NotImplementedError

    def record(self, example: Any, prediction: Any) -> dict[str, Any]:
        """One line of ``lmforge predict`` output."""
        raise NotImplementedError

    def report(self, examples: list[Any], predictions: list[Any]) -> dict[str, Any] | None:
        """The per-class report ``lmforge evaluate`` writes beside its metrics: ``{"unit", "per_class": {name:
        {"precision", "recall", "f1", "support"}}, "confusion": {"labels", "matrix", "rows", "columns"} (when the
        task has one), "unknown_labels": {label: count}}``; None for tasks without classes (QA, regression, multiple
        choice)."""
        return None

    def _unknown_counts(self, examples: list[Any]) -> dict[str, int]:
        return {label: count for label, (count, _) in self.unknown_labels(examples).items()}

    label_noun = "label"  # what the task calls one gold label in messages ("tag" for tagging)

    def gold_labels(self, example: Any) -> list[str]:
        """The gold labels of ``example`` as the model names them (a tagger's tags, a classifier's class); empty
        for an unlabelled example and for tasks without a label vocabulary (QA, multiple choice, regression)."""
        return []

    def unknown_labels(self, examples: list[Any]) -> dict[str, tuple[int, int | None]]:
        """Gold labels of ``examples`` the model cannot produce (never in its training data): ``{label: (count,
        first line)}``, in order of first appearance."""
        found: dict[str, tuple[int, int | None]] = {}
        known = self._label_ids
        for example in examples:
            for label in self.gold_labels(example):
                if label not in known:
                    count, line = found.get(label, (0, getattr(example, "line", None)))
                    found[label] = (count + 1, line)
        return found

    def warn_unknown_labels(self, examples: list[Any], source: str) -> dict[str, tuple[int, int | None]]:
        """Warn once, naming each gold label the model cannot produce with its count and first line: evaluation
        scores those items as misses (a gold entity or class never predicted) instead of stopping.

        Returns:
            ``unknown_labels(examples)``.
        """
        found = self.unknown_labels(examples)
        if found:
            shown = ", ".join(f"{label!r} x{count}" + (f" (first at line {line})" if line is not None else "")
                              for label, (count, line) in list(found.items())[:10])
            more = f" and {len(found) - 10} more" if len(found) > 10 else ""
            log.warning("%s: %d gold %s%s the model cannot produce (never in its training data): %s%s; scored as "
                        "misses. Add examples of them to the training set to learn them", source, len(found),
                        self.label_noun, "s" if len(found) > 1 else "", shown, more)
        return found

    def label_id(self, label: str, where: str) -> int:
        try:
            return self._label_ids[label]
        except KeyError:
            raise LmforgeError(f"{where}: label {label!r} never appears in the training data (labels: "
                               f"{', '.join(map(str, self.labels[:30]))}); fix the file or add examples of it "
                               "to the training set") from None

    @property
    def _label_ids(self) -> dict[str, int]:
        if getattr(self, "_ids_for", None) is not self.labels:
            self._ids, self._ids_for = {label: i for i, label in enumerate(self.labels)}, self.labels
        return self._ids


class TaskObjective:
    """``objective(model, batch)``: the head computes its own loss; one term named after the task.

    With ``lm_weight`` > 0 (GPT-1, Radford et al. 2018, eq. 5: L3 = L2 + lambda * L1) the backbone's language-model
    loss on the task's own inputs is a second term, ``lm``: lambda times the mean next-token cross-entropy over every
    real token that follows a real token (every row of the batch: all windows, all options). Each term is a mean over
    its own items (examples, tokens) for the whole optimizer step, so L = L_task + lambda * L_LM exactly. The
    unweighted LM loss is logged as the metric ``lm_loss``.
    """

    def __init__(self, task: Task, lm_weight: float = 0.0) -> None:
        self.task = task
        self.lm_weight = float(lm_weight)

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        if not self.lm_weight:
            out = model(**batch)
            return ObjectiveOutput({self.task.loss_name: (out.loss_sum, out.loss_count)}, {})
        out, (lm_sum, lm_count) = model(**batch, return_lm_loss=True)
        return ObjectiveOutput({self.task.loss_name: (out.loss_sum, out.loss_count),
                                "lm": (self.lm_weight * lm_sum, lm_count)},
                               {"lm_loss": (lm_sum.detach(), lm_count)})

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        counts = self.task.counts(batch)
        if self.lm_weight:
            counts["lm"] = lm_token_count(batch["attention_mask"])
        return counts


def lm_token_count(attention_mask: Tensor) -> int:
    """Next-token predictions in a batch: positions t+1 that are real and follow a real position t."""
    mask = attention_mask.bool()
    return int((mask[:, 1:] & mask[:, :-1]).sum())


def pad_windows(features: list[Feature], pad_id: int) -> dict[str, Tensor]:
    """Every window of every feature as one right-padded row: ``input_ids``, ``attention_mask``, ``token_type_ids``
    (R, W), and ``doc_index`` (R,) the feature of each row when some feature has several windows (long-text chunks,
    the two orders of a symmetric pair, the options of a multiple-choice question)."""
    rows = [w for f in features for w in f["windows"]]
    segments = [s for f in features for s in f["segments"]]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (row, seg) in enumerate(zip(rows, segments, strict=True)):
        input_ids[r, :len(row)] = torch.tensor(row)
        token_type_ids[r, :len(seg)] = torch.tensor(seg)
        attention_mask[r, :len(row)] = 1
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
    if len(rows) != len(features):
        batch["doc_index"] = torch.tensor([d for d, f in enumerate(features) for _ in f["windows"]])
    return batch


def encode_pair(tokenizer: Any, a: str, b: str, max_length: int) -> tuple[list[int], list[int], int]:
    """``[CLS] a [SEP] b [SEP]`` cut longest-first to ``max_length`` tokens, as ``tokenizer(a, b, max_length=...,
    truncation="longest_first")`` gives it (Hugging Face's rule: the shorter text keeps its length when it fits in
    half the budget, else half; the longer one gets the rest), but silently: the task counts what was cut and says it
    once for the whole file (``warn_truncated``) instead of one warning per line.

    Returns:
        (input ids, token type ids, the length before cutting).
    """
    ids_a, ids_b = tokenizer.encode_ids(a), tokenizer.encode_ids(b)
    full = len(ids_a) + len(ids_b) + 3
    budget = max_length - 3
    if budget < 0:
        raise LmforgeError(f"max_length={max_length} is shorter than a pair's three special tokens; raise it")
    if full > max_length:
        first_is_shorter = len(ids_a) <= len(ids_b)
        shorter = min(len(ids_a) if first_is_shorter else len(ids_b), budget // 2)
        keep_a, keep_b = (shorter, budget - shorter) if first_is_shorter else (budget - shorter, shorter)
        ids_a, ids_b = ids_a[:keep_a], ids_b[:keep_b]
    ids = [tokenizer.cls_id, *ids_a, tokenizer.sep_id, *ids_b, tokenizer.sep_id]
    return ids, [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1), full


_QUIET_TRUNCATION: contextvars.ContextVar[bool] = contextvars.ContextVar("lmforge_quiet_truncation", default=False)


@contextlib.contextmanager
def quiet_truncation() -> Iterator[None]:
    """Within it ``warn_truncated`` logs at debug level (``-v`` shows it): for a caller that cuts inputs by design
    and has said so once, as ``lmforge compare`` does before its many runs over the same texts."""
    token = _QUIET_TRUNCATION.set(True)
    try:
        yield
    finally:
        _QUIET_TRUNCATION.reset(token)


def warn_truncated(cut: Sequence[tuple[int | None, int]], total: int, what: str, *, max_length: int, unit: str,
                   action: str, fix: str) -> None:
    """One warning for all the inputs of a file that did not fit (not one per line): how many, the longest, and
    the first line numbers, e.g. "3 of 279 examples are longer than max_length=128 tokens and were truncated
    (longest 612 tokens; lines 4, 17, 90): raise --max-length ...".

    Args:
        cut: ``(line, length)`` of each input that was cut (line None when unknown), in file order.
        total: the inputs read.
        what: their name ("examples", "sentences").
        max_length: the limit; ``unit`` names what it counts ("tokens", "sub-words").
        action: what was done to them ("were truncated").
        fix: the options that change it.
    """
    if not cut:
        return
    lines = [line for line, _ in cut if line is not None]
    shown = ", ".join(map(str, lines[:5])) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    where = f"; line{'s' if len(lines) > 1 else ''} {shown}" if lines else ""
    level = logging.DEBUG if _QUIET_TRUNCATION.get() else logging.WARNING
    log.log(level, "%d of %d %s are longer than max_length=%d %s and %s (longest %d %s%s): %s", len(cut), total,
            what, max_length, unit, action, max(length for _, length in cut), unit, where, fix)


def cut_sentences(examples: Sequence[Any], features: Sequence[Feature], tokenizer: Any) -> list[tuple[int | None, int]]:
    """``(line, sub-words with [CLS] and [SEP])`` of each word-level example whose feature lost words to
    ``max_length`` (``n_words`` < ``n_words_total``), for ``warn_truncated``."""
    cut = []
    for example, feature in zip(examples, features, strict=True):
        if feature["n_words"] < feature["n_words_total"]:
            length = sum(len(tokenizer.encode_ids(w) or [0]) for w in example.tokens) + 2
            cut.append((getattr(example, "line", None), length))
    return cut


def progress_bar(total: int, desc: str | None):
    """A tqdm bar over ``total`` model inputs, labelled ``desc``; None draws nothing (the default: library calls and
    ``-q`` stay silent). A bar opened while another one runs (the dev evaluation inside training) is removed when
    it ends, so the training bar keeps its line."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="input", dynamic_ncols=True, disable=desc is None, leave=False)


def run_model(model: nn.Module, features: list[Feature], collate: Callable[[list[Feature]], dict[str, Tensor]],
              batch_size: int, *, drop: Sequence[str] = (), progress: str | None = None
              ) -> Iterator[tuple[list[int], Any]]:
    """Yield ``(feature indices, head output)`` over ``features`` in eval mode without gradients.

    Features are sorted by length so each batch pads little; ``drop`` names batch keys (labels) not to pass;
    ``progress`` labels a progress bar over the features (None: no bar).
    """
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: feature_length(features[i]))
    was_training = model.training
    model.eval()
    bar = progress_bar(len(order), progress)
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            batch = collate([features[i] for i in chunk])
            batch = {k: v.to(device) for k, v in batch.items() if k not in drop}
            # no_grad around the call only: held across the yield, it would switch gradients off in the caller's
            # code too, and two interleaved generators would leave them off for good (each restores what it saw)
            with torch.no_grad():
                out = model(**batch)
            yield chunk, out
            bar.update(len(chunk))
    finally:
        bar.close()
        model.train(was_training)
