"""Token task: the tag set is closed under the scheme, unseen gold tags at evaluation, the per-type report."""

from __future__ import annotations

import pytest

from lmforge.config import TaskConfig
from lmforge.data.readers import TaggedSentence
from lmforge.errors import LmforgeError
from lmforge.tasks import make_task
from lmforge.tokenizers import WordPieceTokenizer
from tests.toy_tasks import vocab

TOKENIZER = WordPieceTokenizer(vocab())


def _sentence(pairs: list[tuple[str, str]], line: int = 1) -> TaggedSentence:
    return TaggedSentence([w for w, _ in pairs], [t for _, t in pairs], line)


TRAIN = [_sentence([("alice", "B-PER"), ("bob", "I-PER"), ("saw", "O"), ("rome", "B-LOC")]),
         _sentence([("paris", "B-LOC"), ("today", "O")], 6)]


@pytest.mark.parametrize("scheme, expected", [
    ("BIO", ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]),
    ("BIOES", ["O", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-PER", "I-PER", "E-PER", "S-PER"]),
])
def test_fit_labels_closes_the_tag_set(scheme, expected):
    train = TRAIN if scheme == "BIO" else [_sentence([("alice", "B-PER"), ("bob", "E-PER"), ("rome", "S-LOC")])]
    task = make_task(TaskConfig(task="token"))
    task.fit_labels(train)
    assert task.scheme == scheme and task.labels == expected


def test_iob1_data_is_closed_in_bio():
    task = make_task(TaskConfig(task="token", scheme="IOB1"))
    task.fit_labels([_sentence([("alice", "I-PER"), ("saw", "O")])])
    assert task.labels == ["O", "B-PER", "I-PER"]


def test_training_data_without_entities_is_refused():
    task = make_task(TaskConfig(task="token"))
    with pytest.raises(LmforgeError, match="single tag"):
        task.fit_labels([_sentence([("alice", "O")])])


def test_unseen_gold_tags_are_counted_and_never_stop_evaluation():
    task = make_task(TaskConfig(task="token"))
    task.fit_labels(TRAIN)
    test = [_sentence([("rome", "B-LOC"), ("oslo", "I-LOC")], 3), _sentence([("lima", "B-GPE")], 9),
            _sentence([("cairo", "B-GPE"), ("delhi", "I-GPE")], 12)]
    assert task.unknown_labels(test) == {"B-GPE": (2, 9), "I-GPE": (1, 12)}  # I-LOC is known: its type was seen
    features = task.featurize(test, TOKENIZER, training=False)
    assert [f["n_words"] for f in features] == [2, 1, 2] and all("labels" not in f for f in features)
    with pytest.raises(LmforgeError, match="'B-GPE' never appears in the training data"):
        task.featurize(test, TOKENIZER, training=True)


def test_report_scores_every_entity_type_and_confuses_types_per_token():
    task = make_task(TaskConfig(task="token"))
    task.fit_labels(TRAIN)
    gold = [_sentence([("alice", "B-PER"), ("saw", "O"), ("lima", "B-GPE")])]
    report = task.report(gold, [{"tags": ["B-PER", "O", "B-LOC"]}])
    assert report["per_class"]["PER"]["f1"] == 1.0 and report["per_class"]["GPE"]["recall"] == 0.0
    assert report["per_class"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert report["unknown_labels"] == {"B-GPE": 1}
    labels, matrix = report["confusion"]["labels"], report["confusion"]["matrix"]
    assert labels == ["O", "LOC", "PER", "GPE"]
    assert matrix[labels.index("GPE")][labels.index("LOC")] == 1  # the GPE token was taken for a LOC
