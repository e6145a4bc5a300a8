"""Token classification (``--task token``): CoNLL column files, sub-word alignment, softmax or CRF, entity F1.

The tag scheme (BIO, IOB1 or BIOES) is detected from the training tags unless ``--scheme`` names it. IOB1 files
are trained as BIO (the same entities, a tag set whose constraints a CRF can express with one start rule) and
predictions are written back in IOB1. Sentences longer than ``max_length`` sub-words are cut at a word boundary
with a counted warning; the words cut off are predicted ``O``. Metrics: entity-level precision, recall and F1 the
conlleval way (an entity counts when its boundaries and type are exact), per-type F1 and token accuracy.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.tasks.base import Feature, Task, cut_sentences, run_model, warn_truncated

log = logging.getLogger("lmforge")


class TokenTask(Task):
    head_type = "token_classification"
    options = ("crf", "scheme", "subwords", "word_pooling", "allow_causal")
    loss_name = "tag"
    label_noun = "tag"
    default_metric = "f1"

    @property
    def scheme(self) -> str:
        """The scheme of the user's files (resolved from ``auto`` by ``fit_labels``)."""
        return self.config.scheme

    @property
    def model_scheme(self) -> str:
        """The scheme the head is trained in: IOB1 becomes BIO."""
        return "BIO" if self.scheme == "IOB1" else self.scheme

    def head_options(self) -> dict[str, Any]:
        c = self.config
        options = {"labels": self.labels, "crf": c.crf, "scheme": self.model_scheme, "subwords": c.subwords,
                   "word_pooling": c.word_pooling}
        return {**options, "dropout": c.dropout} if c.dropout is not None else options

    # ---------------------------------------------------------------------------------------- data
    def read(self, path: str, *, labelled: bool = True) -> list[Any]:
        from lmforge.data.readers import read_conll
        from lmforge.data.schemes import check_scheme

        sentences = read_conll(path, require_tags=labelled)
        if labelled and self.config.scheme != "auto":
            check_scheme([s.tags for s in sentences], self.config.scheme, lines=[s.line for s in sentences],
                         source=str(path))
        return sentences

    def fit_labels(self, examples: list[Any]) -> None:
        from lmforge.data.schemes import close_labels, detect_scheme

        if self.config.scheme == "auto":
            self.config = replace(self.config, scheme=detect_scheme([s.tags for s in examples]))
            log.info("tag scheme: %s (detected; --scheme to set it)", self.scheme)
        tags = {t for s in examples for t in self._model_tags(s.tags)}
        if tags <= {"O"}:
            raise LmforgeError(f"the training data has a single tag ({', '.join(sorted(tags))}); tagging needs "
                               "entities (B-X/I-X tags) as well as O")
        # closed under the scheme: B-sportsteam brings I-sportsteam even when no team of two words was seen
        self.labels = close_labels(tags, self.model_scheme)
        added = [t for t in self.labels if t not in tags]
        if added:
            shown = ", ".join(added[:8]) + (f" and {len(added) - 8} more" if len(added) > 8 else "")
            log.info("tag set: %d tags, closed under %s: added %s (their entity types are in the training data, "
                     "these tags are not), so the model can predict them", len(self.labels), self.model_scheme, shown)

    def gold_labels(self, example: Any) -> list[str]:
        return self._model_tags(example.tags) if example.tags is not None else []

    def _model_tags(self, tags: list[str]) -> list[str]:
        from lmforge.data.schemes import convert_tags

        return convert_tags(tags, "IOB1", "BIO") if self.scheme == "IOB1" else list(tags)

    def _featurize(self, examples: list[Any], tokenizer: Any, *, training: bool) -> list[Feature]:
        from lmforge.data.token_features import featurize_tagging

        pairs = []
        for s in examples:
            tags = None
            if s.tags is not None and training:  # prediction reads no gold tags: metrics take them from examples
                tags = self._model_tags(s.tags)
                for t in tags:
                    if t not in self._label_ids:
                        self.label_id(t, f"line {s.line}")  # raises, naming the line
            pairs.append((s.tokens, tags))
        features, truncated = featurize_tagging(pairs, tokenizer, self._label_ids, self.config.max_length,
                                                subwords=self.config.subwords)
        if truncated:
            warn_truncated(cut_sentences(examples, features, tokenizer), len(examples), "sentences",
                           max_length=self.config.max_length, unit="sub-words",
                           action="lost their last words (predicted O)", fix="raise --max-length")
        return features

    def collate(self, features: list[Feature], pad_id: int) -> dict[str, Tensor]:
        from lmforge.data.token_features import collate_tagging

        return collate_tagging(features, pad_id)

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        key = "subword_labels" if self.config.subwords == "all" and not self.config.crf else "labels"
        return {self.loss_name: int((batch[key] != -100).sum())}

    # ---------------------------------------------------------------------------------------- outputs
    def predict(self, model: nn.Module, examples: list[Any], features: list[Feature], tokenizer: Any, *,
                batch_size: int = 32, progress: str | None = None) -> list[dict[str, Any]]:
        from lmforge.data.schemes import convert_tags

        head = model.head
        results: list[dict[str, Any] | None] = [None] * len(examples)
        collate = lambda fs: self.collate(fs, tokenizer.pad_id)  # noqa: E731
        for chunk, out in run_model(model, features, collate, batch_size, drop=("labels", "subword_labels"),
                                    progress=progress):
            paths = head.decode(out)
            probs = out.word_logits.float().softmax(-1).cpu()  # (B, W, L): CRF emissions normalised per word
            for j, i in enumerate(chunk):
                ids = paths[j]
                n_total = features[i]["n_words_total"]
                tags = [self.labels[k] for k in ids] + ["O"] * (n_total - len(ids))
                scores = [float(probs[j, w, k]) for w, k in enumerate(ids)] + [0.0] * (n_total - len(ids))
                if self.scheme == "IOB1":
                    tags = convert_tags(tags, "BIO", "IOB1")
                results[i] = {"tags": tags, "scores": scores}
        return results  # type: ignore[return-value]

    def metrics(self, examples: list[Any], predictions: list[dict[str, Any]]) -> dict[str, float]:
        from lmforge.metrics import entity_scores

        gold = [s.tags for s in examples]
        pred = [p["tags"] for p in predictions]
        scores = entity_scores(gold, pred, scheme=self.scheme)
        n_tokens = sum(len(g) for g in gold)
        correct = sum(a == b for g, p in zip(gold, pred, strict=True) for a, b in zip(g, p, strict=True))
        out = {"precision": scores["precision"], "recall": scores["recall"], "f1": scores["f1"],
               "accuracy": correct / max(n_tokens, 1)}
        out.update({f"f1_{kind}": v["f1"] for kind, v in sorted(scores["per_type"].items())})
        return out

    def report(self, examples: list[Any], predictions: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Entity-level scores per type (conlleval's), and the token-level confusion between entity types (what a
        missed type was taken for: O or another type)."""
        from lmforge.data.schemes import entity_types
        from lmforge.metrics import entity_scores, tag_type_confusion

        gold = [s.tags for s in examples]
        pred = [p["tags"] for p in predictions]
        scores = entity_scores(gold, pred, scheme=self.scheme)
        labels, matrix = tag_type_confusion(gold, pred, entity_types(self.labels))
        return {"unit": "entity type", "per_class": scores["per_type"],
                "confusion": {"labels": labels, "matrix": matrix, "rows": "gold entity type (per token)",
                              "columns": "predicted entity type (per token)"},
                "unknown_labels": self._unknown_counts(examples)}

    def record(self, example: Any, prediction: dict[str, Any]) -> dict[str, Any]:
        from lmforge.data.schemes import tags_to_spans

        entities = [{"start": s, "end": e, "label": label, "text": " ".join(example.tokens[s:e])}
                    for s, e, label in tags_to_spans(prediction["tags"], self.scheme)]
        return {"tokens": example.tokens, "tags": prediction["tags"], "entities": entities}
