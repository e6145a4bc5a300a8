"""Classification and regression metrics: hand-computed values, scikit-learn / SciPy parity, degenerate inputs."""

import math

import numpy as np
import pytest

from lmforge.errors import LmforgeError
from lmforge.metrics import (
    accuracy,
    classification_metrics,
    macro_f1,
    matthews_corrcoef,
    mean_squared_error,
    pearson,
    regression_metrics,
    spearman,
)

GOLD = ["a", "a", "b", "b", "c", "a", "c"]
PRED = ["a", "b", "b", "b", "a", "a", "d"]


def test_hand_computed_classification():
    assert accuracy(GOLD, PRED) == pytest.approx(4 / 7)
    # per class F1 = 2tp / (2tp + fp + fn): a 4/6, b 4/5, c 0 (never predicted right), d 0 (never in gold)
    assert macro_f1(GOLD, PRED) == pytest.approx((4 / 6 + 4 / 5) / 4)
    assert macro_f1(GOLD, PRED, labels=["a", "b"]) == pytest.approx((4 / 6 + 4 / 5) / 2)
    # binary MCC = (tp tn - fp fn) / sqrt(...) with tp=2, tn=3, fp=1, fn=1
    gold, pred = [1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0]
    assert matthews_corrcoef(gold, pred) == pytest.approx((2 * 3 - 1 * 1) / math.sqrt(3 * 3 * 4 * 4))
    assert classification_metrics(gold, gold) == {"accuracy": 1.0, "f1": 1.0, "mcc": 1.0}
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)


def test_degenerate_classification():
    assert matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0  # constant prediction
    assert matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0  # a single class everywhere: undefined
    with pytest.raises(LmforgeError, match="empty"):
        accuracy([], [])
    with pytest.raises(LmforgeError, match="differ in length"):
        macro_f1([1, 2], [1])


def test_sklearn_parity():
    metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is the reference for F1 and MCC")
    rng = np.random.default_rng(0)
    for n_classes, n in [(2, 37), (3, 101), (5, 13), (7, 250)]:
        gold = rng.integers(n_classes, size=n).tolist()
        pred = rng.integers(n_classes + 1, size=n).tolist()  # a class that gold lacks
        assert accuracy(gold, pred) == pytest.approx(metrics.accuracy_score(gold, pred))
        assert macro_f1(gold, pred) == pytest.approx(metrics.f1_score(gold, pred, average="macro",
                                                                      zero_division=0), abs=1e-12)
        assert matthews_corrcoef(gold, pred) == pytest.approx(metrics.matthews_corrcoef(gold, pred), abs=1e-12)
    words = ["pos", "neg", "neu"]
    gold = [words[i] for i in rng.integers(3, size=40)]
    pred = [words[i] for i in rng.integers(2, size=40)]  # never predicts "neu"
    assert macro_f1(gold, pred) == pytest.approx(metrics.f1_score(gold, pred, average="macro", zero_division=0))


def test_hand_computed_regression():
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.5]
    xm, ym = 2.5, 5.125
    dx, dy = [v - xm for v in x], [v - ym for v in y]
    covariance = sum(a * b for a, b in zip(dx, dy, strict=True))
    expected = covariance / math.sqrt(sum(a * a for a in dx) * sum(b * b for b in dy))
    assert pearson(x, y) == pytest.approx(expected)
    assert spearman(x, y) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    # ties share average ranks: y ranks are [1.5, 1.5, 3, 4]
    r = [1.5, 1.5, 3.0, 4.0]
    expected_rho = pearson([1, 2, 3, 4], r)
    assert spearman([10, 20, 30, 40], [5, 5, 6, 7]) == pytest.approx(expected_rho)
    assert mean_squared_error([1, 2], [2, 4]) == pytest.approx(2.5)
    assert regression_metrics(x, x) == {"pearson": 1.0, "spearman": 1.0, "mse": 0.0}


def test_degenerate_regression():
    assert pearson([1, 2, 3], [5, 5, 5]) == 0.0
    assert spearman([1, 2, 3], [5, 5, 5]) == 0.0
    assert pearson([1.0], [2.0]) == 0.0
    with pytest.raises(LmforgeError, match="nan or infinite"):
        pearson([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(LmforgeError, match="empty"):
        regression_metrics([], [])


def test_scipy_parity():
    stats = pytest.importorskip("scipy.stats", reason="SciPy is the reference for Pearson and Spearman")
    rng = np.random.default_rng(1)
    for n in (5, 33, 200):
        x = rng.normal(size=n)
        y = 0.6 * x + rng.normal(size=n)
        ties = np.round(y * 2) / 2  # many ties
        assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
        assert spearman(np.round(x), ties) == pytest.approx(stats.spearmanr(np.round(x), ties)[0], abs=1e-12)
