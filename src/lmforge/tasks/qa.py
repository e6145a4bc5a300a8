"""Extractive question answering (``--task qa``): SQuAD v1.1 / v2.0 files, sliding windows, n-best decoding.

Contexts longer than the window are split with ``doc_stride`` (``lmforge.data.qa_features``), so nothing is
truncated away; questions longer than ``max_query_length`` tokens are cut. SQuAD v2.0 (unanswerable questions,
the null answer) is switched on when the training file holds an impossible question, or by ``version_2``.
Metrics are the official exact match and F1 in percent.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
from torch import Tensor, nn

from lmforge.tasks.base import Feature, Task, run_model

log = logging.getLogger("lmforge")


class QATask(Task):
    head_type = "qa"
    options = ("doc_stride", "max_query_length", "max_answer_length", "n_best", "null_threshold", "version_2")
    loss_name = "qa"
    default_metric = "f1"

    def head_options(self) -> dict[str, Any]:
        return {"dropout": self.config.dropout} if self.config.dropout is not None else {}

    def read(self, path: str, *, labelled: bool = True) -> list[Any]:
        from lmforge.data.readers import read_squad

        return read_squad(path, require_answers=labelled)

    def fit_labels(self, examples: list[Any]) -> None:
        if self.config.version_2 is None:
            self.config = replace(self.config, version_2=any(e.is_impossible for e in examples))

    def _featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        from lmforge.data.qa_features import featurize_qa

        c = self.config
        features = featurize_qa(examples, tokenizer, max_length=c.max_length, doc_stride=c.doc_stride,
                                max_query_length=c.max_query_length, training=training)
        if len(features) > len(examples):
            log.info("%d questions -> %d windows (contexts longer than max_length=%d are split with "
                     "doc_stride=%d; nothing is truncated)", len(examples), len(features), c.max_length,
                     c.doc_stride)
        return features

    def collate(self, features: list[Feature], pad_id: int) -> dict[str, Tensor]:
        from lmforge.data.qa_features import collate_qa

        return collate_qa(features, pad_id)

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {self.loss_name: int(batch["input_ids"].shape[0])}

    def predict(self, model: nn.Module, examples: list[Any], features: list[Feature], tokenizer: Any, *,
                batch_size: int = 32, progress: str | None = None) -> list[dict[str, Any]]:
        from lmforge.data.qa_features import decode_qa

        starts: list[np.ndarray | None] = [None] * len(features)
        ends: list[np.ndarray | None] = [None] * len(features)
        for chunk, out in run_model(model, features, lambda fs: self.collate(fs, tokenizer.pad_id), batch_size,
                                    drop=("start_positions", "end_positions"), progress=progress):
            s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            for j, i in enumerate(chunk):
                n = len(features[i]["input_ids"])
                starts[i], ends[i] = s[j, :n], e[j, :n]
        c = self.config
        decoded = decode_qa(examples, features, starts, ends, n_best=c.n_best, max_answer_length=c.max_answer_length,
                            version_2=bool(c.version_2), null_threshold=c.null_threshold)
        return [decoded[e.id] for e in examples]

    def metrics(self, examples: list[Any], predictions: list[dict[str, Any]]) -> dict[str, float]:
        from lmforge.metrics import squad_scores

        return squad_scores({e.id: p["text"] for e, p in zip(examples, predictions, strict=True)}, examples)

    def record(self, example: Any, prediction: dict[str, Any]) -> dict[str, Any]:
        return {"id": example.id, "question": example.question, "answer": prediction["text"],
                "start": prediction["start"], "end": prediction["end"], "score": prediction.get("score")}
