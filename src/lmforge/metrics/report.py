"""Per-class reports: precision, recall, F1 and support for every class (or entity type), a confusion matrix, and a
readable Markdown rendering, as ``lmforge evaluate`` writes them next to its metrics.

The summary metrics (accuracy, macro F1, entity F1) say how good a model is; the per-class rows say where it fails
(a class never predicted, an entity type confused with another). Conventions match ``lmforge.metrics``: a ratio
with a zero denominator is 0 (scikit-learn's ``zero_division=0``); ``support`` is the number of gold items.

A confusion matrix is ``matrix[i][j]`` = how many items of gold class ``labels[i]`` were predicted as
``labels[j]`` (rows gold, columns predicted, as scikit-learn's ``confusion_matrix``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from lmforge.errors import LmforgeError

__all__ = ["class_report", "confusion_matrix", "format_report", "tag_type_confusion"]


def _prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def _ordered(labels: Iterable[Hashable] | None, *seen: Iterable[Hashable]) -> list[Hashable]:
    """``labels`` in their order, then every other value of ``seen`` in order of first appearance."""
    out = dict.fromkeys(labels or ())
    for values in seen:
        out.update(dict.fromkeys(values))
    return list(out)


def confusion_matrix(gold: Sequence[Hashable], pred: Sequence[Hashable],
                     labels: Sequence[Hashable] | None = None) -> tuple[list[Hashable], list[list[int]]]:
    """Counts of (gold, predicted) pairs.

    Args:
        gold: gold labels, one per item.
        pred: predicted labels, same length.
        labels: the row and column order; values of ``gold`` or ``pred`` not in it are appended.

    Returns:
        ``(labels, matrix)`` with ``matrix[i][j]`` the items of gold ``labels[i]`` predicted ``labels[j]``.
    """
    if len(gold) != len(pred):
        raise LmforgeError(f"gold and predictions differ in length ({len(gold)} vs {len(pred)})")
    order = _ordered(labels, gold, pred)
    index = {label: i for i, label in enumerate(order)}
    matrix = [[0] * len(order) for _ in order]
    for g, p in zip(gold, pred, strict=True):
        matrix[index[g]][index[p]] += 1
    return order, matrix


def class_report(gold: Sequence[Hashable], pred: Sequence[Hashable],
                 labels: Sequence[Hashable] | None = None) -> dict[str, Any]:
    """Per-class precision, recall, F1 and support of single-label predictions, with the confusion matrix.

    Args:
        gold: gold labels.
        pred: predicted labels.
        labels: the classes in report order (e.g. the model's labels); others seen in gold or predictions follow.

    Returns:
        ``{"per_class": {label: {"precision", "recall", "f1", "support"}}, "confusion": {"labels", "matrix"}}``
        (labels as strings).
    """
    if not len(gold):
        raise LmforgeError("cannot report on an empty set of examples")
    order, matrix = confusion_matrix(gold, pred, labels)
    per_class = {}
    for i, label in enumerate(order):
        tp = matrix[i][i]
        per_class[str(label)] = {**_prf(tp, sum(row[i] for row in matrix), sum(matrix[i])), "support": sum(matrix[i])}
    return {"per_class": per_class, "confusion": {"labels": [str(label) for label in order], "matrix": matrix}}


def tag_type_confusion(gold_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]],
                       types: Sequence[str] = ()) -> tuple[list[str], list[list[int]]]:
    """Token-level confusion between entity types (the tag's prefix dropped: ``B-PER`` and ``I-PER`` are ``PER``).

    Entity F1 says a type is missed; this says what it was taken for (``O``, or another type). Rows are gold,
    columns predicted, ``O`` first, then ``types``, then any other type seen.
    """
    from lmforge.data.schemes import label_of

    gold = [label_of(t) or "O" for tags in gold_tags for t in tags]
    pred = [label_of(t) or "O" for tags in pred_tags for t in tags]
    order, matrix = confusion_matrix(gold, pred, ["O", *types])
    return [str(label) for label in order], matrix


def format_report(report: dict[str, Any], *, title: str, unit: str = "class") -> str:
    """A Markdown rendering of ``report["per_class"]`` (one table row per class) and its summary metrics.

    Args:
        report: ``{"per_class": {...}, "metrics": {...}}``; ``metrics`` (optional) is listed above the table.
        title: the heading.
        unit: the name of a row ("class", "entity type").
    """
    lines = [f"# {title}", ""]
    metrics = report.get("metrics") or {}
    if metrics:
        lines += [", ".join(f"{name} {value:.4f}" if isinstance(value, float) else f"{name} {value}"
                            for name, value in metrics.items()), ""]
    lines += [f"| {unit} | precision | recall | f1 | support |", "|---|---:|---:|---:|---:|"]
    for label, row in report["per_class"].items():
        lines.append(f"| {label} | {row['precision']:.4f} | {row['recall']:.4f} | {row['f1']:.4f} | "
                     f"{row['support']} |")
    unknown = report.get("unknown_labels") or {}
    if unknown:
        lines += ["", "Gold labels the model cannot produce (never in its training data), scored as misses: "
                  + ", ".join(f"{label} ({count})" for label, count in unknown.items()) + "."]
    return "\n".join(lines) + "\n"

