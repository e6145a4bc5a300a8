"""Token classification head: word pooling, the alignment round trip, losses, CRF constraints, training."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

from lmforge.config import ModelConfig
from lmforge.data.token_features import collate_tagging, featurize_tagging
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel
from lmforge.heads.token import (
    TokenClassificationHead,
    TokenClassificationOutput,
    _scheme_constraints,
    build_token_head,
    pool_words,
)
from lmforge.models.encoder import Encoder
from lmforge.tokenizers import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "john", "smith", "mary", "jo", "##nes", "went", "to",
         "lon", "##don", "par", "##is", "new", "york", "visited", "and", "the", "city", "of", "."]
LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
L2I = {x: i for i, x in enumerate(LABELS)}
PAD = 0


@pytest.fixture(scope="module")
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


class Out(NamedTuple):
    last_hidden_state: torch.Tensor


def random_batch(B: int = 3, T: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Random sub-word scores and a word_index with multi-piece words, specials and padding."""
    g = torch.Generator().manual_seed(seed)
    word_index = torch.tensor([[-1, 0, 0, 1, 2, 2, -1],
                               [-1, 0, 1, -1, -1, -1, -1],
                               [-1, 0, 1, 1, 1, 2, 3]])  # the last row is cut (no [SEP]) by truncation
    return torch.randn(B, T, len(LABELS), generator=g), word_index, 4


# ---------------------------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("how", ["first", "mean"])
def test_pool_words_matches_a_loop(how: str) -> None:
    scores, word_index, W = random_batch()
    pooled, mask = pool_words(scores, word_index, W, how)
    assert pooled.shape == (3, W, len(LABELS))
    for b in range(3):
        for w in range(W):
            positions = (word_index[b] == w).nonzero().squeeze(1)
            assert bool(mask[b, w]) == (len(positions) > 0)
            if len(positions) == 0:
                assert float(pooled[b, w].abs().sum()) == 0.0
                continue
            want = scores[b, positions[0]] if how == "first" else scores[b, positions].mean(0)
            torch.testing.assert_close(pooled[b, w], want)


# ---------------------------------------------------------------------------------------------- round trip
ROUND_TRIP = [
    (["John", "Smith", "went", "to", "London"], ["B-PER", "I-PER", "O", "O", "B-LOC"]),
    (["Mary", "Jones", "visited", "Paris", "\x07", "zzz"], ["B-PER", "I-PER", "O", "B-LOC", "O", "B-PER"]),
    (["the", "city", "of", "New", "York", "and", "London", "and", "Paris"],  # truncated by max_length
     ["O", "O", "O", "B-LOC", "I-LOC", "O", "B-LOC", "O", "B-LOC"]),
    ([], []),
]


def perfect_head(crf: bool = False, subwords: str = "first", word_pooling: str = "first") -> TokenClassificationHead:
    """A head whose classifier is the identity: the "hidden states" are the logits."""
    head = TokenClassificationHead(len(LABELS), LABELS, dropout=0.0, crf=crf, subwords=subwords,
                                   word_pooling=word_pooling)
    with torch.no_grad():
        head.classifier.weight.copy_(torch.eye(len(LABELS)))
        head.classifier.bias.zero_()
    return head


@pytest.mark.parametrize("crf", [False, True])
def test_round_trip_first_subword(tok, crf: bool) -> None:
    features, n_truncated = featurize_tagging(ROUND_TRIP, tok, L2I, max_length=12)
    assert n_truncated == 1
    assert [f["n_words"] for f in features] == [5, 6, 8, 0]
    assert features[1]["input_ids"].count(tok.unk_id) == 2  # the control character and "zzz"
    batch = collate_tagging(features, PAD)
    word_index, labels = batch["word_index"], batch["labels"]
    # Perfect scores on each word's first piece, a wrong label (cyclically next) on every other piece.
    first = torch.ones_like(word_index, dtype=torch.bool)
    first[:, 1:] = word_index[:, 1:] != word_index[:, :-1]
    gold = labels.gather(1, word_index.clamp(min=0)).clamp(min=0)
    target = torch.where(first, gold, (gold + 1) % len(LABELS))
    hidden = F.one_hot(target, len(LABELS)).float() * 10
    head = perfect_head(crf=crf)
    decoded = head.decode(head(Out(hidden), word_index))
    assert decoded == [[L2I[t] for t in tags[:f["n_words"]]] for (_, tags), f in zip(ROUND_TRIP, features,
                                                                                       strict=True)]


def test_round_trip_all_subwords_mean_pooling(tok) -> None:
    features, _ = featurize_tagging(ROUND_TRIP, tok, L2I, max_length=12, subwords="all")
    batch = collate_tagging(features, PAD)
    hidden = F.one_hot(batch["subword_labels"].clamp(min=0), len(LABELS)).float() * 10  # every piece right
    head = perfect_head(subwords="all", word_pooling="mean")
    with torch.no_grad():
        out = head(Out(hidden), batch["word_index"], subword_labels=batch["subword_labels"])
    assert head.decode(out) == [f["labels"] for f in features]
    assert float(out.loss_sum) < 1e-2 and int(out.loss_count) == sum(len(f["input_ids"]) - 2 for f in features)


# ---------------------------------------------------------------------------------------------- losses
def test_softmax_loss_is_summed_over_first_subwords() -> None:
    scores, word_index, W = random_batch()
    labels = torch.tensor([[1, 2, 0, -100], [3, 4, -100, -100], [0, 1, 2, 3]])
    with torch.no_grad():
        out = perfect_head()(Out(scores), word_index, labels=labels)
    firsts = {(0, 1): 1, (0, 3): 2, (0, 4): 0, (1, 1): 3, (1, 2): 4, (2, 1): 0, (2, 2): 1, (2, 5): 2, (2, 6): 3}
    want = sum(float(F.cross_entropy(scores[b, t], torch.tensor(y))) for (b, t), y in firsts.items())
    assert float(out.loss_sum) == pytest.approx(want, rel=1e-5)
    assert int(out.loss_count) == len(firsts)
    assert out.word_logits.shape == (3, W, len(LABELS)) and out.subword_logits.shape == scores.shape


def test_crf_loss_counts_words_and_starts_equal_to_softmax() -> None:
    scores, word_index, _ = random_batch()
    labels = torch.tensor([[1, 2, 0, -100], [3, 4, -100, -100], [0, 1, 2, 3]])
    with torch.no_grad():
        soft = perfect_head()(Out(scores), word_index, labels=labels)
        crf = perfect_head(crf=True)(Out(scores), word_index, labels=labels)  # zero transitions, no constraints
    assert int(crf.loss_count) == int(soft.loss_count) == 9
    assert float(crf.loss_sum) == pytest.approx(float(soft.loss_sum), rel=1e-5)


def test_gradients_reach_the_classifier_and_crf() -> None:
    scores, word_index, _ = random_batch()
    labels = torch.tensor([[1, 2, 0, -100], [3, 4, -100, -100], [0, 1, 2, 3]])
    head = build_token_head(ModelConfig(vocab_size=30, d_model=len(LABELS), n_heads=1, n_layers=1),
                            None, labels=LABELS, crf=True, dropout=0.0)
    head(Out(scores), word_index, labels=labels).loss_sum.backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and float(p.grad.abs().sum()) > 0, name


# ---------------------------------------------------------------------------------------------- constraints
def valid_sequences(types: list[str], n: int, scheme: str) -> set[tuple[str, ...]]:
    """Every tag sequence of length n that encodes a set of non-overlapping typed spans (the oracle)."""
    found = set()

    def encode(pos: int, tags: list[str]) -> None:
        if pos == n:
            found.add(tuple(tags))
            return
        encode(pos + 1, [*tags, "O"])
        for end in range(pos + 1, n + 1):
            for kind in types:
                width = end - pos
                if scheme == "BIO":
                    piece = [f"B-{kind}"] + [f"I-{kind}"] * (width - 1)
                elif width == 1:
                    piece = [f"S-{kind}"]
                else:
                    piece = [f"B-{kind}"] + [f"I-{kind}"] * (width - 2) + [f"E-{kind}"]
                encode(end, tags + piece)

    encode(0, [])
    return found


@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
def test_scheme_constraints_allow_exactly_the_valid_sequences(scheme: str) -> None:
    types = ["PER", "LOC"]
    prefixes = "BI" if scheme == "BIO" else "BIES"
    labels = ["O"] + [f"{p}-{t}" for t in types for p in prefixes]
    start, trans, end = _scheme_constraints(labels, scheme)
    for n in range(1, 5):
        accepted = {tuple(labels[i] for i in path) for path in itertools.product(range(len(labels)), repeat=n)
                    if start[path[0]] and end[path[-1]] and all(trans[a][b] for a, b in itertools.pairwise(path))}
        assert accepted == valid_sequences(types, n, scheme), n


def test_crf_head_decodes_only_valid_bio() -> None:
    torch.manual_seed(0)
    head = build_token_head(ModelConfig(vocab_size=30, d_model=12, n_heads=2, n_layers=1), None, labels=LABELS,
                            crf=True, scheme="BIO", dropout=0.0)
    hidden = torch.randn(20, 9, 12) * 30
    word_index = torch.arange(-1, 8).expand(20, 9).clone()
    word_index[:, -1] = -1
    valid = valid_sequences(["PER", "LOC"], 7, "BIO")
    for path in head.decode(head(Out(hidden), word_index)):
        assert tuple(LABELS[i] for i in path) in valid


def test_option_errors() -> None:
    with pytest.raises(LmforgeError, match="subwords='first'"):
        TokenClassificationHead(12, LABELS, crf=True, subwords="all")
    with pytest.raises(LmforgeError, match="subwords='all' with it"):
        TokenClassificationHead(12, LABELS, word_pooling="mean")
    with pytest.raises(LmforgeError, match="labels repeat O"):
        TokenClassificationHead(12, ["O", "O"])
    with pytest.raises(LmforgeError, match="'E-PER' does not belong to the BIO scheme"):
        _scheme_constraints(["O", "B-PER", "E-PER"], "BIO")
    with pytest.raises(LmforgeError, match="unknown tag scheme"):
        _scheme_constraints(LABELS, "BILUO")
    assert _scheme_constraints(["O", "I-PER", "B-PER"], "IOB1") is None
    head = TokenClassificationHead(12, LABELS, subwords="all")
    scores, word_index, _ = random_batch()
    with pytest.raises(LmforgeError, match="pass subword_labels"):
        head(Out(torch.randn(3, 7, 12)), word_index, labels=torch.zeros(3, 4, dtype=torch.long))


def test_empty_batch_rows_and_no_labels() -> None:
    head = perfect_head(crf=True)
    out = head(Out(torch.randn(2, 3, len(LABELS))), torch.full((2, 3), -1))
    assert out.word_logits.shape == (2, 0, len(LABELS)) and out.loss_sum is None
    assert head.decode(out) == [[], []]
    assert isinstance(out, TokenClassificationOutput)


# ---------------------------------------------------------------------------------------------- training
TRAIN = [
    (["John", "Smith", "went", "to", "London"], ["B-PER", "I-PER", "O", "O", "B-LOC"]),
    (["Mary", "Jones", "visited", "New", "York"], ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]),
    (["Mary", "went", "to", "the", "city", "of", "Paris"], ["B-PER", "O", "O", "O", "O", "O", "B-LOC"]),
    (["London", "and", "Paris", "."], ["B-LOC", "O", "B-LOC", "O"]),
    (["John", "visited", "Mary", "Jones", "."], ["B-PER", "O", "B-PER", "I-PER", "O"]),
    (["New", "York", "and", "London"], ["B-LOC", "I-LOC", "O", "B-LOC"]),
    (["Jones", "went", "to", "Paris"], ["B-PER", "O", "O", "B-LOC"]),  # Jones: B-PER alone, I-PER after Mary
]


@pytest.mark.parametrize("crf,subwords,pooling", [(False, "first", "first"), (True, "first", "mean"),
                                                  (False, "all", "mean")])
def test_tiny_model_learns_a_toy_tagging_task(tok, crf: bool, subwords: str, pooling: str) -> None:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=len(VOCAB), d_model=12, n_heads=2, n_layers=2, d_ff=37, max_seq_len=32,
                         dropout=0.0, attention_dropout=0.0)
    model = TaskModel(Encoder(config), build_token_head(config, None, labels=LABELS, crf=crf, subwords=subwords,
                                                        word_pooling=pooling))
    features, _ = featurize_tagging(TRAIN, tok, L2I, max_length=32, subwords=subwords)
    batch = collate_tagging(features, PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(80):
        out = model(**batch)
        optimizer.zero_grad()
        (out.loss_sum / out.loss_count).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        assert model.head.decode(model(**batch)) == [f["labels"] for f in features]
