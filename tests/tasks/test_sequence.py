"""Sequence task: long-text modes, pair encoding, chunk pooling, regression."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig, TaskConfig
from lmforge.data.readers import ClassificationExample
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.heads.classification import pool_rows
from lmforge.models import Encoder
from lmforge.tasks import make_task
from lmforge.tokenizers import WordPieceTokenizer
from tests.toy_tasks import vocab

TOKENIZER = WordPieceTokenizer(vocab())
WORDS = ["alice", "bob", "carol", "dave", "erin", "frank", "paris", "rome", "oslo", "lima"]


def _task(**options) -> object:
    task = make_task(TaskConfig(task="sequence", max_length=8, **options))
    task.labels = ["neg", "pos"]
    return task


def _example(n_words: int) -> ClassificationExample:
    return ClassificationExample(" ".join(WORDS[i % len(WORDS)] for i in range(n_words)), None, "pos", 2)


def _ids(words: list[str]) -> list[int]:
    return [TOKENIZER.vocab[w] for w in words]


def test_truncate_head_tail_and_chunks():
    text_ids = _ids([WORDS[i % len(WORDS)] for i in range(15)])  # 15 tokens, room for 6
    cls, sep = TOKENIZER.cls_id, TOKENIZER.sep_id
    [short] = _task().featurize([_example(4)], TOKENIZER, training=True)
    assert short["windows"] == [[cls, *text_ids[:4], sep]] and short["label"] == 1
    [cut] = _task().featurize([_example(15)], TOKENIZER, training=True)
    assert cut["windows"] == [[cls, *text_ids[:6], sep]]
    [head_tail] = _task(long_text="head-tail", head_tokens=2).featurize([_example(15)], TOKENIZER, training=True)
    assert head_tail["windows"] == [[cls, *text_ids[:2], *text_ids[-4:], sep]]
    [default_ht] = _task(long_text="head-tail").featurize([_example(15)], TOKENIZER, training=True)
    assert default_ht["windows"] == [[cls, *text_ids[:1], *text_ids[-5:], sep]]  # a quarter of the room
    [chunks] = _task(long_text="chunks").featurize([_example(15)], TOKENIZER, training=True)
    assert chunks["windows"] == [[cls, *text_ids[s:s + 6], sep] for s in (0, 6, 12)]
    task = _task(long_text="chunks", max_chunks=2)
    [capped] = task.featurize([_example(15)], TOKENIZER, training=True)
    assert len(capped["windows"]) == 2 and task.truncated == 1


def test_truncation_is_counted():
    task = _task()
    task.featurize([_example(3), _example(15), _example(7)], TOKENIZER, training=True)
    assert task.truncated == 2


def test_pair_uses_segment_ids_and_longest_first():
    task = make_task(TaskConfig(task="pair", max_length=8))
    task.labels = ["different", "same"]
    [feature] = task.featurize([ClassificationExample("alice bob carol dave", "paris rome", "same", 2)], TOKENIZER,
                               training=True)
    [ids] = feature["windows"]
    assert ids == [TOKENIZER.cls_id, *_ids(["alice", "bob", "carol"]), TOKENIZER.sep_id, *_ids(["paris", "rome"]),
                   TOKENIZER.sep_id]
    assert feature["segments"] == [[0] * 5 + [1] * 3] and task.truncated == 1


@pytest.mark.parametrize("mode", ["head-tail", "chunks"])
def test_pairs_refuse_the_single_text_long_modes(mode):
    with pytest.raises(LmforgeError, match="long_text=.*single texts"):
        TaskConfig(task="pair", long_text=mode)


def test_chunked_documents_are_classified_by_their_mean_window_logits():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=TOKENIZER.vocab_size, d_model=12, n_heads=2, n_layers=1, d_ff=37, max_seq_len=16,
                         dropout=0.0, attention_dropout=0.0)
    backbone = Encoder(config)
    task = _task(long_text="chunks")
    model = TaskModel(backbone, build_head(task.head_spec(), config, backbone)).eval()
    features = task.featurize([_example(15), _example(3)], TOKENIZER, training=True)
    batch = task.collate(features, TOKENIZER.pad_id)
    assert batch["doc_index"].tolist() == [0, 0, 0, 1] and batch["labels"].tolist() == [1, 1]
    with torch.no_grad():
        pooled = model(**batch).logits
        for d, feature in enumerate(features):
            rows = task.collate([feature], TOKENIZER.pad_id)
            rows.pop("doc_index", None)
            rows.pop("labels")
            alone = model(**rows).logits  # one row per window, not pooled
            torch.testing.assert_close(pooled[d], alone.mean(0))
    assert task.counts(batch) == {"cls": 2}


def test_pool_rows_is_a_per_document_mean():
    logits = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert pool_rows(logits, torch.tensor([0, 1, 1])).tolist() == [[1.0, 2.0], [4.0, 5.0]]


def test_regression_and_label_errors(tmp_path):
    data = tmp_path / "sts.csv"
    data.write_text("text,label\nalice bob,1.5\ncarol dave,4\n", encoding="utf-8")
    task = make_task(TaskConfig(task="sequence"))
    examples = task.read(str(data))
    task.fit_labels(examples)
    assert task.regression and task.labels == [] and task.metric == "pearson"
    assert task.head_options()["regression"] is True
    [f1, f2] = task.featurize(examples, TOKENIZER, training=True)
    assert (f1["label"], f2["label"]) == (1.5, 4.0)
    classes = tmp_path / "classes.csv"
    classes.write_text("text,label\nalice,10\nbob,2\ncarol,2\n", encoding="utf-8")
    fresh = make_task(TaskConfig(task="sequence"))
    fresh.fit_labels(fresh.read(str(classes)))
    assert fresh.labels == ["2", "10"]  # numeric labels in numeric order
    with pytest.raises(LmforgeError, match="trained for classification"):
        fresh.read(str(data))
    single = tmp_path / "single.csv"
    single.write_text("text,label\nalice,a\nbob,a\n", encoding="utf-8")
    one = make_task(TaskConfig(task="sequence"))
    with pytest.raises(LmforgeError, match="single label"):
        one.fit_labels(one.read(str(single)))


def test_the_classifier_starts_as_berts_on_an_encoder():
    from lmforge.heads.classification import build_sequence_head

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=99, d_model=384, n_heads=2, n_layers=1, d_ff=37, max_seq_len=16)
    head = build_sequence_head(config, Encoder(config), labels=[str(i) for i in range(50)])
    weight = head.classifier.weight
    assert torch.count_nonzero(head.classifier.bias) == 0  # google-research/bert: zeros, N(0, 0.02) weights
    assert abs(weight.std().item() - 0.02) < 0.001 and weight.abs().max().item() > 1 / 384 ** 0.5  # not uniform


@pytest.mark.parametrize("max_length", [3, 5, 8, 11, 16])
def test_encode_pair_matches_the_tokenizers_longest_first_truncation(max_length):
    """The tasks cut pairs themselves (to warn once per file, not per line); the result is the tokenizer's."""
    from lmforge.tasks.base import encode_pair

    for n_a in range(0, 9):
        for n_b in range(0, 9):
            a, b = " ".join(WORDS[:n_a]), " ".join(WORDS[::-1][:n_b])
            expected = TOKENIZER(a, b, max_length=max_length, truncation="longest_first")
            ids, types, full = encode_pair(TOKENIZER, a, b, max_length)
            assert (ids, types) == (expected["input_ids"], expected["token_type_ids"]), (n_a, n_b)
            assert full == n_a + n_b + 3


def test_unseen_gold_labels_do_not_stop_evaluation_features():
    task = _task()
    unseen = ClassificationExample("alice", None, "neutral", 7)
    with pytest.raises(LmforgeError, match="'neutral' never appears in the training data"):
        task.featurize([unseen], TOKENIZER, training=True)  # training on an unknown label is still an error
    [feature] = task.featurize([unseen], TOKENIZER, training=False)
    assert "label" not in feature
    assert task.unknown_labels([unseen, _example(2), unseen]) == {"neutral": (2, 7)}
