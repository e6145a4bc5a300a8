"""ROUGE-1/2/L F-measures of generated texts (Lin, 2004), computed by Google's ``rouge-score`` package.

``pip install 'lmforge[rouge]'`` installs it; without it, ``rouge_scores`` raises a clear error. Scores are
averaged over texts and given in percent, with the Porter stemmer on (as ROUGE is usually reported for
summarisation and headline generation).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmforge.errors import LmforgeError

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge_scores(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F1 (percent) of ``predictions`` against ``references``."""
    try:
        from rouge_score import rouge_scorer
    except ImportError as err:
        raise LmforgeError("ROUGE needs the rouge-score package: pip install 'lmforge[rouge]'") from err
    if len(predictions) != len(references):
        raise LmforgeError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        raise LmforgeError("cannot score an empty set of texts")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for prediction, reference in zip(predictions, references, strict=True):
        for name, score in scorer.score(reference, prediction).items():
            totals[name] += score.fmeasure
    return {name: 100.0 * total / len(references) for name, total in totals.items()}
