"""Entity-level precision, recall and F1 as the CoNLL shared tasks score them (the conlleval script).

A predicted entity is correct only when a gold entity has exactly the same start, end and type. Scores are
micro-averaged over all entities of all sentences (Tjong Kim Sang & De Meulder, 2003), and also reported per
type. Tags are decoded with :func:`lmforge.data.schemes.tags_to_spans`, which follows conlleval for ill-formed
sequences: an ``I-X`` after ``O`` or after another type starts a new entity.

Scores are fractions in [0, 1] (conlleval prints percentages); a precision or recall with a zero denominator is
0, and so is F1 when precision + recall is 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from lmforge.data.schemes import tags_to_spans
from lmforge.errors import LmforgeError

__all__ = ["entity_scores", "span_scores"]

Span = tuple[int, int, str]


def _prf(correct: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    precision = correct / n_pred if n_pred else 0.0
    recall = correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def span_scores(gold_spans: Sequence[Iterable[Span]], pred_spans: Sequence[Iterable[Span]]) -> dict[str, Any]:
    """Exact-match scores of labelled spans, one collection of ``(start, end, type)`` per sentence.

    Each sentence's spans are compared as sets (a duplicated prediction counts once).

    Args:
        gold_spans: per sentence, the gold spans.
        pred_spans: per sentence, the predicted spans (same number of sentences).

    Returns:
        ``{"precision", "recall", "f1", "per_type": {type: {"precision", "recall", "f1", "support"}}}`` where
        ``support`` is the number of gold entities of the type; types in gold or predictions are listed.
    """
    if len(gold_spans) != len(pred_spans):
        raise LmforgeError(f"gold and predictions differ in the number of sentences ({len(gold_spans)} vs "
                           f"{len(pred_spans)})")
    if not len(gold_spans):
        raise LmforgeError("cannot score an empty set of sentences")
    gold_count: Counter = Counter()
    pred_count: Counter = Counter()
    correct: Counter = Counter()
    for gold, pred in zip(gold_spans, pred_spans, strict=True):
        gold_set, pred_set = set(gold), set(pred)
        gold_count.update(kind for _, _, kind in gold_set)
        pred_count.update(kind for _, _, kind in pred_set)
        correct.update(kind for _, _, kind in gold_set & pred_set)
    precision, recall, f1 = _prf(sum(correct.values()), sum(pred_count.values()), sum(gold_count.values()))
    per_type = {}
    for kind in sorted(gold_count.keys() | pred_count.keys()):
        p, r, f = _prf(correct[kind], pred_count[kind], gold_count[kind])
        per_type[kind] = {"precision": p, "recall": r, "f1": f, "support": gold_count[kind]}
    return {"precision": precision, "recall": recall, "f1": f1, "per_type": per_type}


def entity_scores(gold_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                  scheme: str = "BIO") -> dict[str, Any]:
    """conlleval's entity scores from tag sequences (see :func:`span_scores` for the result).

    Args:
        gold_tags: per sentence, the gold tags.
        pred_tags: per sentence, the predicted tags (same lengths as gold).
        scheme: the tagging scheme of both (BIO, IOB1, BIOES).

    Raises:
        LmforgeError: different numbers of sentences or a sentence whose lengths differ (named by index).
    """
    if len(gold_tags) != len(pred_tags):
        raise LmforgeError(f"gold and predictions differ in the number of sentences ({len(gold_tags)} vs "
                           f"{len(pred_tags)})")
    for i, (gold, pred) in enumerate(zip(gold_tags, pred_tags, strict=True)):
        if len(gold) != len(pred):
            raise LmforgeError(f"sentence {i}: {len(gold)} gold tags but {len(pred)} predicted; predict one tag "
                               f"per token")
    return span_scores([tags_to_spans(t, scheme) for t in gold_tags], [tags_to_spans(t, scheme) for t in pred_tags])
