"""Sequence and sentence-pair classification / regression (``--task sequence`` and ``--task pair``).

Texts longer than ``max_length`` tokens (BERT's window is 512; a BBC article often runs past 128) are handled as
``long_text`` says, and the number of examples that did not fit is reported:

- ``truncate``: the first ``max_length - 2`` tokens;
- ``head-tail``: the first ``head_tokens`` and the last ``max_length - 2 - head_tokens`` tokens (Sun et al., 2019,
  "How to Fine-Tune BERT for Text Classification", found head 128 + tail 382 best for long IMDb reviews); the
  default ``head_tokens`` is a quarter of the window, their ratio;
- ``chunks``: consecutive windows of ``max_length - 2`` tokens (at most ``max_chunks``, counted when cut), each
  encoded on its own; the document's logits are the mean of its windows' logits, in training and prediction.

A pair (``--task pair``) is encoded as ``[CLS] a [SEP] b [SEP]`` with segment ids 0/1 and cut longest-first. A
similarity pair has no order (``--task.symmetric=true``, GPT-1's similarity transformation): it is encoded both ways,
(a, b) and (b, a), and the two representations are added before the classifier.

On a GPT backbone (``input_format`` "gpt", ``lmforge.tasks.gpt_inputs``) the same rows read ``[START] text [EXTRACT]``
and ``[START] a [DELIM] b [EXTRACT]``, and the representation is the extract token's state.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.tasks.base import Feature, Task, encode_pair, pad_windows, run_model, warn_truncated

log = logging.getLogger("lmforge")


def _sort_labels(labels: set[str]) -> list[str]:
    """Numeric labels in numeric order ("2" before "10"), others alphabetically."""
    try:
        return sorted(labels, key=float)
    except ValueError:
        return sorted(labels)


class SequenceTask(Task):
    head_type = "sequence_classification"
    options = ("text_column", "text_pair_column", "label_column", "long_text", "head_tokens", "max_chunks",
               "symmetric", "pooling")
    loss_name = "cls"

    def __init__(self, config, labels=None, regression: bool = False) -> None:
        super().__init__(config, labels)
        self.regression = regression
        self.truncated = 0  # examples of the last featurize call that did not fit

    @property
    def pair(self) -> bool:
        return self.config.task == "pair"

    @property
    def default_metric(self) -> str:  # type: ignore[override]
        return "pearson" if self.regression else "accuracy"

    def head_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"labels": self.labels, "regression": self.regression}
        if self.config.symmetric:  # both orders' representations are added (GPT-1's similarity)
            options["combine_windows"] = "sum_states"
        if self.config.pooling != "cls":  # the mean of the final states (absent from older folders: cls)
            options["pooling"] = self.config.pooling
        return options

    @classmethod
    def from_head_spec(cls, spec: dict[str, Any]) -> SequenceTask:
        task = super().from_head_spec(spec)
        task.regression = bool(spec.get("regression", False))
        return task

    # ---------------------------------------------------------------------------------------- data
    def read(self, path: str, *, labelled: bool = True) -> list[Any]:
        from lmforge.data.readers import read_classification

        c = self.config
        data = read_classification(path, text_column=c.text_column, text_pair_column=c.text_pair_column,
                                   label_column=c.label_column, require_labels=labelled, pair=self.pair,
                                   read_labels=labelled)
        fitted = bool(self.labels) or self.regression
        if labelled and fitted and data.kind is not None and (data.kind == "regression") != self.regression:
            found = "numbers with decimals" if data.kind == "regression" else "classes"
            raise LmforgeError(f"{path}: the labels are {found}, but the model was trained for "
                               f"{'regression' if self.regression else 'classification'}")
        self._kind = data.kind
        return data.examples

    def fit_labels(self, examples: list[Any]) -> None:
        self.regression = getattr(self, "_kind", None) == "regression"
        self.labels = [] if self.regression else _sort_labels({str(e.label) for e in examples})
        if not self.regression and len(self.labels) < 2:
            raise LmforgeError(f"the training data has a single label ({self.labels}); classification needs two "
                               "or more")

    def gold_labels(self, example: Any) -> list[str]:
        return [] if self.regression or example.label is None else [str(example.label)]

    def _target(self, example: Any, training: bool) -> float | int | None:
        if example.label is None:
            return None
        if self.regression:
            return float(example.label)
        if not training and str(example.label) not in self._label_ids:
            return None  # a class the model cannot produce: scored as a miss (warn_unknown_labels)
        return self.label_id(str(example.label), f"line {example.line}")

    def _featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        c = self.config
        room = c.max_length - 2
        features, cut = [], []
        for i, example in enumerate(examples):
            if self.pair:
                orders = [(example.text, example.text_pair or "")]
                if c.symmetric:
                    orders.append(orders[0][::-1])
                windows, segments = [], []
                for a, b in orders:
                    ids, types, full = encode_pair(tokenizer, a, b, c.max_length)
                    windows.append(ids)
                    segments.append(types)
                if full > c.max_length:
                    cut.append((getattr(example, "line", None), full))
            else:
                ids = tokenizer.encode_ids(example.text)
                pieces, was_cut = self._fit(ids, room)
                if was_cut:
                    cut.append((getattr(example, "line", None), len(ids) + 2))
                windows = [[tokenizer.cls_id, *p, tokenizer.sep_id] for p in pieces]
                segments = [[0] * len(w) for w in windows]
            feature: Feature = {"windows": windows, "segments": segments, "example_index": i,
                                "length": max(len(w) for w in windows) * len(windows)}
            target = self._target(example, training)
            if target is not None:
                feature["label"] = target
            features.append(feature)
        self.truncated = len(cut)
        if self.pair:
            warn_truncated(cut, len(examples), "pairs", max_length=c.max_length, unit="tokens",
                           action="were cut longest-first", fix="raise --max-length")
        else:
            how = {"truncate": "were truncated", "head-tail": "were cut to their head and tail",
                   "chunks": f"were cut at {c.max_chunks} windows"}[c.long_text]
            warn_truncated(cut, len(examples), "examples", max_length=c.max_length, unit="tokens", action=how,
                           fix="--long-text truncate|head-tail|chunks, --max-length")
        return features

    def _fit(self, ids: list[int], room: int) -> tuple[list[list[int]], bool]:
        """The token windows of one text and whether anything was dropped."""
        c = self.config
        if len(ids) <= room:
            return [ids], False
        if c.long_text == "truncate":
            return [ids[:room]], True
        if c.long_text == "head-tail":
            head = c.head_tokens if c.head_tokens is not None else room // 4
            return [ids[:head] + ids[len(ids) - (room - head):]], True
        windows = [ids[s:s + room] for s in range(0, len(ids), room)]
        return windows[:c.max_chunks], len(windows) > c.max_chunks

    def collate(self, features: list[Feature], pad_id: int) -> dict[str, Tensor]:
        batch = pad_windows(features, pad_id)
        if all("label" in f for f in features):
            dtype = torch.float32 if self.regression else torch.long
            batch["labels"] = torch.tensor([f["label"] for f in features], dtype=dtype)
        return batch

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {self.loss_name: int(batch["labels"].shape[0])}

    # ---------------------------------------------------------------------------------------- outputs
    def predict(self, model: nn.Module, examples: list[Any], features: list[Feature], tokenizer: Any, *,
                batch_size: int = 32, progress: str | None = None) -> list[dict[str, Any]]:
        logits: list[Tensor | None] = [None] * len(examples)
        for chunk, out in run_model(model, features, lambda fs: self.collate(fs, tokenizer.pad_id), batch_size,
                                    drop=("labels",), progress=progress):
            for j, i in enumerate(chunk):
                logits[features[i]["example_index"]] = out.logits[j].float().cpu()
        predictions = []
        for row in logits:
            if self.regression:
                predictions.append({"value": float(row[0])})
            else:
                probs = row.softmax(-1)
                best = int(probs.argmax())
                predictions.append({"label": self.labels[best], "score": float(probs[best]),
                                    "probabilities": dict(zip(self.labels, probs.tolist(), strict=True))})
        return predictions

    def metrics(self, examples: list[Any], predictions: list[dict[str, Any]]) -> dict[str, float]:
        from lmforge.metrics import classification_metrics, regression_metrics

        if self.regression:
            return regression_metrics([float(e.label) for e in examples], [p["value"] for p in predictions])
        return classification_metrics([str(e.label) for e in examples], [p["label"] for p in predictions])

    def report(self, examples: list[Any], predictions: list[dict[str, Any]]) -> dict[str, Any] | None:
        from lmforge.metrics import class_report

        if self.regression:
            return None
        report = class_report([str(e.label) for e in examples], [p["label"] for p in predictions], self.labels)
        report["confusion"].update(rows="gold class", columns="predicted class")
        return {"unit": "class", **report, "unknown_labels": self._unknown_counts(examples)}

    def record(self, example: Any, prediction: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"text": example.text}
        if self.pair:
            out["text_pair"] = example.text_pair
        return {**out, **prediction}
