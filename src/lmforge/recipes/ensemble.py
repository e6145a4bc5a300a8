"""Ensembles of fine-tuned sequence classifiers: ``lmforge evaluate`` / ``lmforge predict`` with several ``--model``
folders.

ULMFiT (Howard & Ruder 2018, sections 3.4 and 4) fine-tunes a classifier on a forward and one on a backward language
model (``ModelConfig.reverse``) and averages their predictions; here the class probabilities of any number of
sequence (or pair) classifiers are averaged with equal weights, and each example gets the averaged distribution's
most probable label (the first in label order on a tie) and its probability as ``score``.

Each member featurizes the inputs with its own tokenizer and task settings (``max_length``, ``long_text``); the
file is read with the first member's column settings. The members must be classifiers (not regression) of the same
kind (sequence or pair) and the same label set; probabilities are matched by label name.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

__all__ = ["Ensemble", "model_folders"]


def model_folders(values: list[str] | str) -> list[str]:
    """The ``--model`` values as folders: the option may be repeated, and each value may be a comma list (a value
    that names an existing path is kept whole, commas included)."""
    if isinstance(values, str):
        values = [values]
    folders: list[str] = []
    for value in values:
        parts = [value] if Path(value).exists() else [p.strip() for p in value.split(",")]
        folders += [p for p in parts if p]
    if not folders:
        raise LmforgeError("--model: no model folder given")
    return folders


class Ensemble:
    """The members (model, task, tokenizer) of fine-tuned classifier folders, checked to agree (module docstring).

    Raises:
        LmforgeError: a member that is not a classifier (another task, or regression), members of different kinds
            (single texts and pairs), or different label sets; each message names the folders.
    """

    def __init__(self, folders: list[str], runtime: str = "torch") -> None:
        from lmforge.recipes.finetune import load_task_model

        if len(folders) < 2:
            raise LmforgeError(f"an ensemble needs two or more model folders, got {len(folders)}")
        self.folders = [str(f) for f in folders]
        self.members = [load_task_model(f, runtime) for f in self.folders]
        for folder, (_, task, _) in zip(self.folders, self.members, strict=True):
            kind = task.config.task
            if kind not in ("sequence", "pair"):
                raise LmforgeError(f"{folder}: a model fine-tuned for {kind!r}; an ensemble (several --model) averages "
                                   "the class probabilities of sequence classifiers (--task sequence or pair)")
            if getattr(task, "regression", False):
                raise LmforgeError(f"{folder}: a regression model; an ensemble (several --model) averages the class "
                                   "probabilities of classifiers")
        first, (_, task0, _) = self.folders[0], self.members[0]
        for folder, (_, task, _) in zip(self.folders[1:], self.members[1:], strict=True):
            if task.config.task != task0.config.task:
                raise LmforgeError(f"the ensemble mixes tasks: {first} is fine-tuned for {task0.config.task!r}, "
                                   f"{folder} for {task.config.task!r}")
            if set(task.labels) != set(task0.labels):
                raise LmforgeError(f"the ensemble's label sets differ: {first} has {_show(task0.labels)}, {folder} "
                                   f"has {_show(task.labels)}; average only classifiers of the same labels")

    @property
    def task(self) -> Any:
        """The first member's task: it reads the file, scores and writes the records."""
        return self.members[0][1]

    def read(self, path: str, *, labelled: bool) -> list[Any]:
        return self.task.read(path, labelled=labelled)

    def predict(self, examples: list[Any], path: str, *, batch_size: int = 32,
                progress: str | None = None) -> list[dict[str, Any]]:
        """Each member's predictions, then the average of their class probabilities per example (``progress``
        labels a progress bar per member; None: none)."""
        from lmforge.recipes.finetune import featurize

        per_member = []
        for folder, (model, task, tokenizer) in zip(self.folders, self.members, strict=True):
            features = featurize(task, examples, tokenizer, path, training=False)
            per_member.append(task.predict(model, examples, features, tokenizer, batch_size=batch_size,
                                           progress=progress))
            log.info("ensemble member %s: %d predictions", folder, len(per_member[-1]))
        labels = self.task.labels
        averaged = []
        for i in range(len(examples)):
            probs = [sum(p[i]["probabilities"][label] for p in per_member) / len(per_member) for label in labels]
            best = max(range(len(labels)), key=lambda k: (probs[k], -k))  # the first label on a tie
            averaged.append({"label": labels[best], "score": probs[best],
                             "probabilities": dict(zip(labels, probs, strict=True))})
        return averaged


def _show(labels: list[str], limit: int = 12) -> str:
    shown = ", ".join(map(str, labels[:limit]))
    return f"[{shown}{', ...' if len(labels) > limit else ''}]"
