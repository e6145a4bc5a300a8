"""Per-class reports: counts by hand, the scikit-learn conventions, the entity-type confusion and the Markdown."""

from __future__ import annotations

import pytest

from lmforge.errors import LmforgeError
from lmforge.metrics import class_report, confusion_matrix, format_report, tag_type_confusion


def test_confusion_matrix_rows_are_gold_columns_predicted():
    labels, matrix = confusion_matrix(["a", "a", "b", "c"], ["a", "b", "b", "a"], ["a", "b"])
    assert labels == ["a", "b", "c"]  # "c" (gold only) follows the given order
    assert matrix == [[1, 1, 0], [0, 1, 0], [1, 0, 0]]


def test_class_report_counts_by_hand():
    gold = ["pos", "pos", "pos", "neg", "neg", "unseen"]
    pred = ["pos", "pos", "neg", "neg", "pos", "pos"]
    report = class_report(gold, pred, ["neg", "pos"])
    pos, neg, unseen = (report["per_class"][k] for k in ("pos", "neg", "unseen"))
    assert pos == {"precision": pytest.approx(2 / 4), "recall": pytest.approx(2 / 3), "f1": pytest.approx(4 / 7),
                   "support": 3}
    assert neg == {"precision": pytest.approx(1 / 2), "recall": pytest.approx(1 / 2), "f1": pytest.approx(1 / 2),
                   "support": 2}
    # a gold class the model never predicts: a miss, scored 0 (zero_division=0), never an error
    assert unseen == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert report["confusion"]["labels"] == ["neg", "pos", "unseen"]
    assert sum(map(sum, report["confusion"]["matrix"])) == len(gold)


def test_tag_type_confusion_drops_the_prefixes():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["B-PER", "B-LOC", "O", "O"]]
    labels, matrix = tag_type_confusion(gold, pred, ["LOC", "PER"])
    assert labels == ["O", "LOC", "PER"]
    assert matrix == [[1, 0, 0], [1, 0, 0], [0, 1, 1]]  # the LOC token taken for O, a PER token for LOC


def test_format_report_is_a_markdown_table_with_the_unknown_labels():
    report = class_report(["a", "b"], ["a", "a"], ["a"])
    text = format_report({**report, "metrics": {"accuracy": 0.5}, "unknown_labels": {"b": 1}}, title="run on test")
    lines = text.splitlines()
    assert lines[0] == "# run on test" and "accuracy 0.5000" in lines[2]
    assert "| class | precision | recall | f1 | support |" in lines
    assert "| a | 0.5000 | 1.0000 | 0.6667 | 1 |" in lines and "| b | 0.0000 | 0.0000 | 0.0000 | 1 |" in lines
    assert "scored as misses: b (1)." in text


def test_reports_refuse_bad_input():
    with pytest.raises(LmforgeError, match="empty"):
        class_report([], [])
    with pytest.raises(LmforgeError, match="differ in length"):
        confusion_matrix(["a"], ["a", "b"])
