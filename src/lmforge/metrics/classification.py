"""Sentence-level scores: accuracy, macro F1 and Matthews correlation for classes; Pearson, Spearman and MSE for
regression (the GLUE metrics; Wang et al., 2019).

Conventions (they match scikit-learn and SciPy where those are defined):

* macro F1 averages the per-class F1 over the classes in ``gold`` ∪ ``pred`` (or over ``labels`` when given);
  a class never predicted, or never in gold, has F1 = 0 (scikit-learn's ``zero_division=0``).
* MCC is the multi-class R_K statistic (Gorodkin, 2004), 0.0 when it is undefined (all gold or all predictions
  in one class), as scikit-learn returns.
* Pearson and Spearman are 0.0 when undefined (fewer than two points or a constant input), where SciPy gives
  nan: a constant predictor is then scored as uncorrelated instead of poisoning averages.
* Empty or mismatched inputs raise :class:`~lmforge.errors.LmforgeError`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

from lmforge.errors import LmforgeError

__all__ = [
    "accuracy",
    "classification_metrics",
    "macro_f1",
    "matthews_corrcoef",
    "mean_squared_error",
    "pearson",
    "regression_metrics",
    "spearman",
]


def _check(gold: Sequence, pred: Sequence) -> None:
    if len(gold) != len(pred):
        raise LmforgeError(f"gold and predictions differ in length ({len(gold)} vs {len(pred)}); score one "
                           f"prediction per gold example")
    if not len(gold):
        raise LmforgeError("cannot score an empty set of examples")


def accuracy(gold: Sequence[Hashable], pred: Sequence[Hashable]) -> float:
    """The fraction of predictions equal to the gold label."""
    _check(gold, pred)
    return sum(g == p for g, p in zip(gold, pred, strict=True)) / len(gold)


def macro_f1(gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable] | None = None) -> float:
    """The unweighted mean of per-class F1 (``2 tp / (2 tp + fp + fn)``; 0 for a class with tp = 0).

    Args:
        gold: gold labels.
        pred: predicted labels.
        labels: the classes to average over; default: every class in ``gold`` or ``pred``.
    """
    _check(gold, pred)
    classes = list(dict.fromkeys(labels)) if labels is not None else list(set(gold) | set(pred))
    if not classes:
        raise LmforgeError("macro_f1 needs at least one label to average over")
    tp: Counter = Counter()
    fp: Counter = Counter()
    fn: Counter = Counter()
    for g, p in zip(gold, pred, strict=True):
        if g == p:
            tp[g] += 1
        else:
            fp[p] += 1
            fn[g] += 1
    scores = []
    for c in classes:
        denominator = 2 * tp[c] + fp[c] + fn[c]
        scores.append(2 * tp[c] / denominator if denominator else 0.0)
    return sum(scores) / len(scores)


def matthews_corrcoef(gold: Sequence[Hashable], pred: Sequence[Hashable]) -> float:
    """The multi-class Matthews correlation (R_K), in [-1, 1]; 0.0 when undefined.

    With the confusion counts, ``c`` correct, ``s`` examples, ``t_k`` gold and ``p_k`` predicted per class:
    ``(c s - Σ p_k t_k) / sqrt((s² - Σ p_k²) (s² - Σ t_k²))``; for two classes this is the usual MCC.
    """
    _check(gold, pred)
    s = len(gold)
    c = sum(g == p for g, p in zip(gold, pred, strict=True))
    t = Counter(gold)
    p = Counter(pred)
    # Python integers: the products overflow int64 for a few million examples.
    numerator = c * s - sum(p[k] * t[k] for k in t)
    denominator = (s * s - sum(v * v for v in p.values())) * (s * s - sum(v * v for v in t.values()))
    return numerator / math.sqrt(denominator) if denominator else 0.0


def _floats(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise LmforgeError(f"{name} must be a flat list of numbers, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise LmforgeError(f"{name} holds nan or infinite values; regression scores need finite numbers")
    return array


def _pair(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    _check(x, y)
    return _floats(x, "gold"), _floats(y, "predictions")


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    dx, dy = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float(dx @ dx) * float(dy @ dy))
    if denominator == 0.0:
        return 0.0
    return max(-1.0, min(1.0, float(dx @ dy) / denominator))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks. Shape (N,) -> (N,)."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1  # mean of the 1-based ranks i+1 .. j+1
        i = j + 1
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's correlation coefficient; 0.0 when either input is constant."""
    a, b = _pair(x, y)
    return _pearson(a, b)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson of the ranks, ties given average ranks); 0.0 when undefined."""
    a, b = _pair(x, y)
    return _pearson(_average_ranks(a), _average_ranks(b))


def mean_squared_error(gold: Sequence[float], pred: Sequence[float]) -> float:
    """The mean of ``(gold - pred)²``."""
    a, b = _pair(gold, pred)
    return float(np.mean((a - b) ** 2))


def classification_metrics(gold: Sequence[Hashable], pred: Sequence[Hashable]) -> dict[str, float]:
    """``{"accuracy", "f1" (macro), "mcc"}`` for class labels."""
    return {"accuracy": accuracy(gold, pred), "f1": macro_f1(gold, pred), "mcc": matthews_corrcoef(gold, pred)}


def regression_metrics(gold: Sequence[float], pred: Sequence[float]) -> dict[str, float]:
    """``{"pearson", "spearman", "mse"}`` for real-valued targets."""
    return {"pearson": pearson(gold, pred), "spearman": spearman(gold, pred), "mse": mean_squared_error(gold, pred)}
