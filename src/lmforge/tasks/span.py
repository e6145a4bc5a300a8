"""Span labeling (``--task span``): JSONL sentences with labelled spans, every span up to ``max_span_width`` words
classified, spans decoded greedily, exact-match span F1.

Input lines: ``{"tokens": [...], "spans": [{"start": s, "end": e, "label": "PER"}, ...]}`` with ``end``
EXCLUSIVE (``tokens[s:e]``). Gold spans may nest or overlap (each span is classified on its own); one span takes
one label. Gold spans wider than ``max_span_width`` cannot be predicted and are counted in a warning (raise
``--task.max_span_width``); so are sentences longer than ``max_length`` sub-words.

Options: ``span_features`` "width" (default: [s_i; e_j; g_ij; width embedding]) or "lecture" ([s_i; e_j; g_ij]);
``span_decoding`` "flat" (default: non-overlapping spans) or "nested" (spans that nest or are disjoint; of two
crossing spans the higher-scored one). Metrics are exact-match (start, end, label) precision, recall and F1.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.tasks.base import Feature, Task, cut_sentences, run_model, warn_truncated

log = logging.getLogger("lmforge")


class SpanTask(Task):
    head_type = "span_classification"
    options = ("max_span_width", "span_pooling", "span_features", "span_decoding", "allow_causal")
    loss_name = "span"
    label_noun = "span label"
    default_metric = "f1"

    def head_options(self) -> dict[str, Any]:
        c = self.config
        options = {"labels": self.labels, "max_span_width": c.max_span_width, "pooling": c.span_pooling,
                   "features": c.span_features, "decoding": c.span_decoding}
        return {**options, "dropout": c.dropout} if c.dropout is not None else options

    def read(self, path: str, *, labelled: bool = True) -> list[Any]:
        from lmforge.data.readers import read_spans

        return read_spans(path, require_spans=labelled)

    def fit_labels(self, examples: list[Any]) -> None:
        self.labels = sorted({label for e in examples for _, _, label in e.spans})
        if not self.labels:
            raise LmforgeError("the training data has no labelled span")

    def gold_labels(self, example: Any) -> list[str]:
        return [label for _, _, label in example.spans or ()]

    def _featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        from lmforge.data.token_features import featurize_spans

        c = self.config
        known = self._label_ids
        pairs = []
        for e in examples:
            spans = e.spans
            if spans is not None and training:
                for _, _, label in spans:
                    if label not in known:
                        self.label_id(label, f"line {e.line}")  # raises, naming the line
            elif spans is not None:  # evaluation: a label the model cannot produce is scored as a miss
                spans = [span for span in spans if span[2] in known]
            pairs.append((e.tokens, spans))
        features, truncated, too_wide = featurize_spans(pairs, tokenizer, known, c.max_length, c.max_span_width)
        if truncated:
            warn_truncated(cut_sentences(examples, features, tokenizer), len(examples), "sentences",
                           max_length=c.max_length, unit="sub-words", action="lost their last words",
                           fix="raise --max-length")
        if too_wide:
            log.warning("%d gold spans are wider than max_span_width=%d words and cannot be predicted "
                        "(--task.max_span_width)", too_wide, c.max_span_width)
        return features

    def collate(self, features: list[Feature], pad_id: int) -> dict[str, Tensor]:
        from lmforge.data.token_features import collate_spans

        return collate_spans(features, pad_id)

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {self.loss_name: int((batch["span_labels"] != -100).sum())}

    def predict(self, model: nn.Module, examples: list[Any], features: list[Feature], tokenizer: Any, *,
                batch_size: int = 32, progress: str | None = None) -> list[list[tuple[int, int, str]]]:
        results: list[list[tuple[int, int, str]]] = [[] for _ in examples]
        collate = lambda fs: self.collate(fs, tokenizer.pad_id)  # noqa: E731
        for chunk, out in run_model(model, features, collate, batch_size, drop=("span_labels",), progress=progress):
            for j, spans in enumerate(model.head.decode(out, self.config.span_decoding)):
                results[chunk[j]] = [tuple(s) for s in spans]
        return results

    def metrics(self, examples: list[Any], predictions: list[list[tuple[int, int, str]]]) -> dict[str, float]:
        from lmforge.metrics import span_scores

        scores = span_scores([e.spans for e in examples], predictions)
        out = {"precision": scores["precision"], "recall": scores["recall"], "f1": scores["f1"]}
        out.update({f"f1_{kind}": v["f1"] for kind, v in sorted(scores["per_type"].items())})
        return out

    def report(self, examples: list[Any], predictions: list[list[tuple[int, int, str]]]) -> dict[str, Any] | None:
        from lmforge.metrics import span_scores

        scores = span_scores([e.spans for e in examples], predictions)
        return {"unit": "span label", "per_class": scores["per_type"], "unknown_labels": self._unknown_counts(examples)}

    def record(self, example: Any, prediction: list[tuple[int, int, str]]) -> dict[str, Any]:
        return {"tokens": example.tokens,
                "spans": [{"start": s, "end": e, "label": label, "text": " ".join(example.tokens[s:e])}
                          for s, e, label in prediction]}
