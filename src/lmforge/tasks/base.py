"""What every fine-tuning task shares: the ``Task`` interface, the feature dataset and the objective.

A task turns a user's file into examples (``read``), examples into model features (``featurize``: lists of
ids, one or more features per example), features into padded tensors (``collate``), runs the model over features
(``predict``: one decoded prediction per example), scores predictions (``metrics``) and writes them as JSON
(``record``). Its ``head_spec`` describes the head it needs, with the task's own settings and labels under the
``task`` key, so a saved model folder knows how to read and featurize new inputs (``lmforge predict``,
``lmforge evaluate``, the pipelines).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.config import TaskConfig, from_dict, to_dict
from lmforge.data.batches import FeatureData  # noqa: F401  (re-exported: lmforge.tasks.FeatureData)
from lmforge.errors import LmforgeError
from lmforge.objectives.base import ObjectiveOutput

log = logging.getLogger("lmforge")

Feature = dict[str, Any]


# TaskConfig fields every task reads; fields only the training run reads (never saved with the model)
COMMON_OPTIONS = ("task", "max_length", "dropout", "metric", "input_format")
TRAINING_OPTIONS = ("freeze", "head_lr", "layer_decay", "gradual_unfreezing", "epochs", "init_embeddings",
                    "lm_weight")


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
                batch_size: int = 32) -> list[Any]:
        raise NotImplementedError

    def metrics(self, examples: list[Any], predictions: list[Any]) -> dict[str, float]:
        raise NotImplementedError

    def record(self, example: Any, prediction: Any) -> dict[str, Any]:
        """One line of ``lmforge predict`` output."""
        raise NotImplementedError

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


def feature_length(feature: Feature) -> int:
    """Tokens of a feature: its ``length`` entry, else the length of its ``input_ids``."""
    return int(feature["length"]) if "length" in feature else len(feature["input_ids"])


def run_model(model: nn.Module, features: list[Feature], collate: Callable[[list[Feature]], dict[str, Tensor]],
              batch_size: int, *, drop: Sequence[str] = ()) -> Iterator[tuple[list[int], Any]]:
    """Yield ``(feature indices, head output)`` over ``features`` in eval mode without gradients.

    Features are sorted by length so each batch pads little; ``drop`` names batch keys (labels) not to pass.
    """
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: feature_length(features[i]))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                chunk = order[start:start + batch_size]
                batch = collate([features[i] for i in chunk])
                batch = {k: v.to(device) for k, v in batch.items() if k not in drop}
                yield chunk, model(**batch)
    finally:
        model.train(was_training)
