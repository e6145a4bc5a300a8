"""Evaluation metrics for fine-tuned tasks: sentence classification/regression (GLUE), entities (conlleval),
extractive QA (SQuAD), and per-class reports with confusion matrices. Pure Python and NumPy; no model code.

SQuAD's per-answer F1 is exported as ``squad_f1`` (the module name is ``lmforge.metrics.squad.f1``) so that it is
not mistaken for the classification F1 (``macro_f1``).
"""

from __future__ import annotations

from lmforge.metrics.classification import (
    accuracy,
    classification_metrics,
    macro_f1,
    matthews_corrcoef,
    mean_squared_error,
    pearson,
    regression_metrics,
    spearman,
)
from lmforge.metrics.entities import entity_scores, span_scores
from lmforge.metrics.report import class_report, confusion_matrix, format_report, tag_type_confusion
from lmforge.metrics.rouge import rouge_scores
from lmforge.metrics.squad import exact_match, normalize_answer, squad_scores
from lmforge.metrics.squad import f1 as squad_f1

__all__ = [
    "accuracy",
    "class_report",
    "classification_metrics",
    "confusion_matrix",
    "entity_scores",
    "exact_match",
    "format_report",
    "macro_f1",
    "matthews_corrcoef",
    "mean_squared_error",
    "normalize_answer",
    "pearson",
    "regression_metrics",
    "rouge_scores",
    "spearman",
    "span_scores",
    "squad_f1",
    "squad_scores",
    "tag_type_confusion",
]
