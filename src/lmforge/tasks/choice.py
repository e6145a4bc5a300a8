"""Multiple choice (``--task choice``): pick the right option of each question (``lmforge.heads.choice``).

A question's options are encoded one row each, as a pair (context, option): ``[CLS] context [SEP] option [SEP]``
with segments 0/1, or on a GPT ``[START] context [DELIM] option [EXTRACT]`` (Radford et al. 2018, Figure 1). Rows
longer than ``max_length`` are cut from the context first (longest-first: the context is the longer side), and the
number of cut rows is reported. Prediction: the option with the highest score; metric: accuracy.

Data: ``lmforge.data.readers.read_choices`` (JSON lines ``{"text", "choices": [...], "label"}`` or a table with
``choices0``, ``choices1``, ... columns).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.tasks.base import Feature, Task, encode_pair, pad_windows, run_model, warn_truncated

log = logging.getLogger("lmforge")


class ChoiceTask(Task):
    head_type = "multiple_choice"
    options = ("text_column", "choices_column", "label_column")
    loss_name = "choice"
    default_metric = "accuracy"

    def head_options(self) -> dict[str, Any]:
        return {}

    def read(self, path: str, *, labelled: bool = True) -> list[Any]:
        from lmforge.data.readers import read_choices

        c = self.config
        return read_choices(path, text_column=c.text_column, choices_column=c.choices_column,
                            label_column=c.label_column, require_labels=labelled, read_labels=labelled)

    def fit_labels(self, examples: list[Any]) -> None:
        """Nothing to fit: the label is an option's index, and the head scores options of any number."""
        self.labels = []

    def _featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        c = self.config
        features, cut, rows = [], [], 0
        for i, example in enumerate(examples):
            windows, segments = [], []
            for option in example.choices:
                ids, types, full = encode_pair(tokenizer, example.text, option, c.max_length)
                windows.append(ids)
                segments.append(types)
                if full > c.max_length:
                    cut.append((getattr(example, "line", None), full))
                rows += 1
            feature: Feature = {"windows": windows, "segments": segments, "example_index": i,
                                "length": max(len(w) for w in windows) * len(windows)}
            if example.label is not None:
                feature["label"] = example.label
            features.append(feature)
        warn_truncated(cut, rows, "(context, option) rows", max_length=c.max_length, unit="tokens",
                       action="were cut longest-first", fix="raise --max-length")
        return features

    def collate(self, features: list[Feature], pad_id: int) -> dict[str, Tensor]:
        batch = pad_windows(features, pad_id)
        batch["doc_index"] = torch.tensor([d for d, f in enumerate(features) for _ in f["windows"]])
        batch["option_index"] = torch.tensor([k for f in features for k in range(len(f["windows"]))])
        if all("label" in f for f in features):
            batch["labels"] = torch.tensor([f["label"] for f in features], dtype=torch.long)
        return batch

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {self.loss_name: int(batch["labels"].shape[0])}

    def predict(self, model: nn.Module, examples: list[Any], features: list[Feature], tokenizer: Any, *,
                batch_size: int = 32, progress: str | None = None) -> list[dict[str, Any]]:
        predictions: list[dict[str, Any] | None] = [None] * len(examples)
        for chunk, out in run_model(model, features, lambda fs: self.collate(fs, tokenizer.pad_id), batch_size,
                                    drop=("labels",), progress=progress):
            for j, i in enumerate(chunk):
                index = features[i]["example_index"]
                n = len(examples[index].choices)
                probs = out.logits[j, :n].float().softmax(-1).cpu()
                best = int(probs.argmax())
                predictions[index] = {"label": best, "choice": examples[index].choices[best],
                                      "score": float(probs[best]), "probabilities": probs.tolist()}
        return predictions  # type: ignore[return-value]

    def metrics(self, examples: list[Any], predictions: list[dict[str, Any]]) -> dict[str, float]:
        from lmforge.metrics.classification import accuracy

        return {"accuracy": accuracy([e.label for e in examples], [p["label"] for p in predictions])}

    def record(self, example: Any, prediction: dict[str, Any]) -> dict[str, Any]:
        return {"text": example.text, "choices": list(example.choices), **prediction}
