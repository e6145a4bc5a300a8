"""Featurizers and collate functions of the tagging and span-labeling tasks."""

from __future__ import annotations

import pytest
import torch

from lmforge.data.token_features import (
    collate_spans,
    collate_tagging,
    featurize_spans,
    featurize_tagging,
    split_words,
)
from lmforge.errors import LmforgeError
from lmforge.heads.span import count_spans, enumerate_spans
from lmforge.tokenizers import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "smith", "went", "to", "lon", "##don", "par", "##is",
         "the", "new", "york", "."]
PAD, UNK, CLS, SEP = 0, 1, 2, 3
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
L2I = {x: i for i, x in enumerate(LABELS)}


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


def ids(*tokens: str) -> list[int]:
    return [VOCAB.index(t) for t in tokens]


def test_split_words_gives_every_word_a_piece_and_fits_whole_words(tok) -> None:
    pieces, kept = split_words(["London", "\x07", "zzz", "to"], tok, max_length=6)
    assert pieces == [ids("lon", "##don"), [UNK], [UNK], ids("to")]
    assert kept == 3  # 2 + 1 + 1 pieces fill the 4 slots between [CLS] and [SEP]
    assert split_words(["London"], tok, max_length=3)[1] == 0  # the only word does not fit


def test_featurize_tagging_first_subword_alignment(tok) -> None:
    sentences = [(["John", "went", "to", "London", "\x07"], ["B-PER", "O", "O", "B-LOC", "O"]),
                 ([], [])]
    features, n_truncated = featurize_tagging(sentences, tok, L2I, max_length=16)
    assert n_truncated == 0
    f = features[0]
    assert f["input_ids"] == [CLS, *ids("john", "went", "to", "lon", "##don"), UNK, SEP]
    assert f["token_type_ids"] == [0] * 8
    assert f["word_index"] == [-1, 0, 1, 2, 3, 3, 4, -1]
    assert f["labels"] == [1, 0, 0, 3, 0]
    assert (f["n_words"], f["n_words_total"]) == (5, 5)
    assert "subword_labels" not in f
    assert features[1] == {"input_ids": [CLS, SEP], "token_type_ids": [0, 0], "word_index": [-1, -1],
                           "labels": [], "n_words": 0, "n_words_total": 0}


def test_featurize_tagging_all_subwords_keep_the_word_label(tok) -> None:
    features, _ = featurize_tagging([(["Paris", "London"], ["B-LOC", "I-LOC"])], tok, L2I, 16, subwords="all")
    assert features[0]["subword_labels"] == [-100, 3, 3, 4, 4, -100]
    assert features[0]["labels"] == [3, 4]


def test_featurize_tagging_truncates_at_word_boundaries(tok) -> None:
    sentences = [(["John", "went", "to", "London"], ["B-PER", "O", "O", "B-LOC"]),  # 5 pieces
                 (["John", "went"], ["B-PER", "O"])]
    features, n_truncated = featurize_tagging(sentences, tok, L2I, max_length=6)
    assert n_truncated == 1
    f = features[0]
    assert f["input_ids"] == [CLS, *ids("john", "went", "to"), SEP]  # London (2 pieces) would need 7 tokens
    assert (f["n_words"], f["n_words_total"], f["labels"]) == (3, 4, [1, 0, 0])
    assert features[1]["n_words"] == 2


def test_featurize_tagging_without_tags(tok) -> None:
    features, _ = featurize_tagging([(["John"], None)], tok, None, 8)
    assert "labels" not in features[0] and features[0]["word_index"] == [-1, 0, -1]


def test_unknown_tag_and_length_mismatch_are_errors(tok) -> None:
    with pytest.raises(LmforgeError, match=r"sentence 1: label 'B-MISC' never appears in the training data"):
        featurize_tagging([(["John"], ["B-PER"]), (["to", "John"], ["O", "B-MISC"])], tok, L2I, 16)
    with pytest.raises(LmforgeError, match="sentence 0 has 2 words but 1 tags"):
        featurize_tagging([(["John", "went"], ["B-PER"])], tok, L2I, 16)
    with pytest.raises(LmforgeError, match="subwords"):
        featurize_tagging([], tok, L2I, 16, subwords="last")
    with pytest.raises(LmforgeError, match="max_length"):
        featurize_tagging([], tok, L2I, 1)


def test_collate_tagging_pads_every_field(tok) -> None:
    sentences = [(["London", "to", "Paris"], ["B-LOC", "O", "B-LOC"]), (["John"], ["B-PER"])]
    features, _ = featurize_tagging(sentences, tok, L2I, 16, subwords="all")
    batch = collate_tagging(features, PAD)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "word_index", "labels",
                          "subword_labels"}
    assert batch["input_ids"].tolist() == [[CLS, *ids("lon", "##don", "to", "par", "##is"), SEP],
                                           [CLS, *ids("john"), SEP, PAD, PAD, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    assert batch["word_index"].tolist() == [[-1, 0, 0, 1, 2, 2, -1], [-1, 0, -1, -1, -1, -1, -1]]
    assert batch["labels"].tolist() == [[3, 0, 3], [1, -100, -100]]
    assert batch["subword_labels"][1].tolist() == [-100, 1, -100, -100, -100, -100, -100]
    assert all(v.dtype == torch.long for v in batch.values())
    with pytest.raises(LmforgeError, match="cannot share a batch"):
        collate_tagging([features[0], featurize_tagging([(["John"], None)], tok, None, 8)[0][0]], PAD)


# ---------------------------------------------------------------------------------------------- spans
SPAN_L2I = {"PER": 0, "LOC": 1}


def test_featurize_spans_places_labels_in_the_enumeration(tok) -> None:
    words = ["John", "Smith", "went", "to", "New", "York"]
    gold = [(0, 2, "PER"), (4, 6, "LOC"), (5, 6, "LOC")]  # nested spans are fine
    features, n_truncated, n_too_wide = featurize_spans([(words, gold)], tok, SPAN_L2I, 16, max_span_width=3)
    f = features[0]
    assert (n_truncated, n_too_wide) == (0, 0)
    assert f["word_starts"] == [1, 2, 3, 4, 5, 6] and f["n_words"] == 6
    spans = enumerate_spans(6, 3)
    assert len(f["span_labels"]) == len(spans) == count_spans(6, 3)
    expected = {(0, 1): 1, (4, 5): 2, (5, 5): 2}
    assert {s: c for s, c in zip(spans, f["span_labels"], strict=True) if c} == expected


def test_featurize_spans_counts_too_wide_and_truncated(tok) -> None:
    words = ["the", "new", "york", "John", "London"]  # London is 2 pieces
    gold = [(0, 3, "LOC"), (3, 4, "PER"), (4, 5, "LOC")]
    features, n_truncated, n_too_wide = featurize_spans([(words, gold)], tok, SPAN_L2I, 7, max_span_width=2)
    f = features[0]
    assert (n_truncated, n_too_wide) == (1, 1)  # London does not fit; "the new york" is 3 words wide
    assert f["n_words"] == 4 and f["n_words_total"] == 5
    spans = enumerate_spans(4, 2)
    assert {s: c for s, c in zip(spans, f["span_labels"], strict=True) if c} == {(3, 3): 1}


def test_bad_spans_are_errors(tok) -> None:
    words = ["John", "went"]
    for gold, message in [([(1, 1, "PER")], "not a non-empty word range"), ([(0, 3, "PER")], "within its 2 words"),
                          ([(0, 1, "ORG")], "sentence 0: label 'ORG' never appears"),
                          ([(0, 1, "PER"), (0, 1, "LOC")], "labelled both 'PER' and 'LOC'")]:
        with pytest.raises(LmforgeError, match=message):
            featurize_spans([(words, gold)], tok, SPAN_L2I, 16, max_span_width=2)


def test_collate_spans(tok) -> None:
    examples = [(["John", "Smith", "went"], [(0, 2, "PER")]), (["London"], [(0, 1, "LOC")])]
    features, _, _ = featurize_spans(examples, tok, SPAN_L2I, 16, max_span_width=2)
    batch = collate_spans(features, PAD)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "word_starts", "word_mask",
                          "span_labels"}
    assert batch["word_starts"].tolist() == [[1, 2, 3], [1, 0, 0]]
    assert batch["word_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["word_mask"].dtype == torch.bool
    # spans of 3 words, width <= 2: (0,0) (0,1) (1,1) (1,2) (2,2); one word: (0,0) then padding
    assert batch["span_labels"].tolist() == [[0, 1, 0, 0, 0], [2, -100, -100, -100, -100]]
    assert batch["input_ids"][1].tolist() == [CLS, *ids("lon", "##don"), SEP, PAD]
