"""GloVe: co-occurrence counting (against brute force, also when spilling), the weighting, the loss and the AdaGrad
step against hand computations, and planted synonyms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.embeddings.glove import GloVe, GloVeConfig, cooccurrence_matrix, glove_weight, train_glove
from lmforge.embeddings.vocab import EncodedCorpus
from lmforge.errors import LmforgeError
from tests.embeddings.synthetic import planted_corpus, planted_ranks_above_random


def _brute_force(sentences: list[list[str]], index: dict[str, int], window: int) -> np.ndarray:
    dense = np.zeros((len(index), len(index)))
    for sentence in sentences:
        kept = [index[w] for w in sentence if w in index]  # dropped words take no position
        for a in range(len(kept)):
            for b in range(a + 1, min(a + window + 1, len(kept))):
                dense[kept[a], kept[b]] += 1.0 / (b - a)
                dense[kept[b], kept[a]] += 1.0 / (b - a)
    return dense


SENTENCES = [s.split() for s in [
    "a b c a d b", "c c a rare b", "d a", "b", "a b c d a b c d e f", "e f e rare f a",
]]


@pytest.mark.parametrize("max_entries", [10_000, 7])  # 7 forces merging, spilling runs and a ranged merge
def test_cooccurrence_matches_brute_force(max_entries):
    corpus = EncodedCorpus.from_sentences(SENTENCES)
    vocab = corpus.build_vocabulary(min_count=2)  # "rare" is dropped before windows are formed
    x = cooccurrence_matrix(corpus, vocab, window=3, max_entries=max_entries, chunk_words=5)
    expected = _brute_force(SENTENCES, vocab.index, window=3)
    np.testing.assert_allclose(x.to_dense(), expected, rtol=1e-6)
    assert x.nnz == int((expected > 0).sum())
    keys = x.rows.astype(np.int64) * x.vocab_size + x.cols
    assert np.all(np.diff(keys) > 0)  # sorted, unique


def test_glove_weight():
    x = torch.tensor([1.0, 50.0, 100.0, 250.0])
    expected = [0.01 ** 0.75, 0.5 ** 0.75, 1.0, 1.0]
    torch.testing.assert_close(glove_weight(x), torch.tensor(expected))
    torch.testing.assert_close(glove_weight(torch.tensor([5.0]), x_max=10, alpha=0.5), torch.tensor([0.5 ** 0.5]))


def _model() -> GloVe:
    model = GloVe(3, 2)
    w = torch.tensor([[0.1, 0.2], [0.3, -0.1], [0.0, 0.5]])
    c = torch.tensor([[0.2, 0.1], [-0.2, 0.4], [0.1, 0.1]])
    model.params.data[:3, :2], model.params.data[3:, :2] = w, c
    model.params.data[:3, 2] = torch.tensor([0.01, 0.02, 0.03])
    model.params.data[3:, 2] = torch.tensor([-0.01, 0.05, 0.0])
    return model


def test_loss_equals_hand_computation():
    model = _model()
    rows, cols, values = torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([4.0, 200.0])
    # entry (0, 1): dot = 0.1*-0.2 + 0.2*0.4 = 0.06; + b0 + b~1 = 0.06 + 0.01 + 0.05 = 0.12; f = (4/100)^0.75
    d0 = 0.12 - math.log(4.0)
    # entry (1, 2): dot = 0.3*0.1 - 0.1*0.1 = 0.02; + 0.02 + 0.0 = 0.04; f = 1 (x >= x_max)
    d1 = 0.04 - math.log(200.0)
    expected = 0.04 ** 0.75 * d0 ** 2 + d1 ** 2
    assert model.loss(rows, cols, values).item() == pytest.approx(expected, rel=1e-5)


def test_adagrad_step_equals_the_reference_update():
    model = _model()
    model.sq_grads.data[0] = 4.0  # a word that has been updated before
    before, sq_before = model.params.clone(), model.sq_grads.clone()
    lr, x = 0.05, 4.0
    loss = model.adagrad_step(torch.tensor([0]), torch.tensor([1]), torch.tensor([x]), lr)
    w, c = before[0, :2], before[4, :2]
    diff = float(w @ c) + float(before[0, 2] + before[4, 2]) - math.log(x)
    fdiff = (x / 100) ** 0.75 * diff
    assert loss == pytest.approx(fdiff * diff, rel=1e-5)
    step = lr * fdiff  # glove.c: fdiff *= eta
    grad_w, grad_c = step * c, step * w
    torch.testing.assert_close(model.params[0, :2], w - grad_w / torch.sqrt(sq_before[0, :2]))
    torch.testing.assert_close(model.params[4, :2], c - grad_c / torch.sqrt(sq_before[4, :2]))
    torch.testing.assert_close(model.params[0, 2], before[0, 2] - step / 2.0)  # sqrt(4)
    torch.testing.assert_close(model.params[4, 2], before[4, 2] - step / 1.0)
    torch.testing.assert_close(model.sq_grads[0, :2], sq_before[0, :2] + grad_w ** 2)
    torch.testing.assert_close(model.sq_grads[4, 2], sq_before[4, 2] + torch.tensor(step) ** 2)
    untouched = [1, 2, 3, 5]
    torch.testing.assert_close(model.params[untouched], before[untouched], rtol=0, atol=0)


def test_adagrad_step_follows_the_gradient_of_half_the_loss():
    torch.manual_seed(0)
    model = GloVe(11, 5)
    rows, cols = torch.tensor([0, 3, 7, 3]), torch.tensor([1, 1, 9, 4])
    values = torch.tensor([3.0, 0.5, 120.0, 7.0])
    with torch.enable_grad():
        model.params.requires_grad_(True)
        (0.5 * model.loss(rows, cols, values)).backward()
        model.params.requires_grad_(False)
    before = model.params.clone()
    model.adagrad_step(rows, cols, values, lr=0.01)  # first step: squared sums are 1, so the step is -lr * grad
    torch.testing.assert_close(model.params - before, -0.01 * model.params.grad, atol=1e-7, rtol=1e-4)


def test_planted_synonyms_rank_above_random_pairs():
    corpus = EncodedCorpus.from_sentences(planted_corpus(800))
    vocab = corpus.build_vocabulary(min_count=1)
    # x_max 10 as in the reference demo for small corpora: here most counts are far below 100
    config = GloVeConfig(dim=16, window=5, min_count=1, epochs=30, x_max=10, batch_size=256, workers=1, seed=2)
    result = train_glove(corpus, vocab, config)
    lowest_planted, highest_random = planted_ranks_above_random(result.vectors.similarity)
    assert lowest_planted > highest_random, (lowest_planted, highest_random)
    assert result.epochs[-1].loss < result.epochs[0].loss
    assert result.vectors.vectors.shape == (len(vocab), 16)


def test_no_cooccurrence_is_an_error():
    corpus = EncodedCorpus.from_sentences([["alone"], ["alone"]])
    vocab = corpus.build_vocabulary(min_count=1)
    with pytest.raises(LmforgeError, match="no two kept words co-occur"):
        train_glove(corpus, vocab, GloVeConfig(min_count=1, epochs=1, workers=1))


def test_a_diverging_fit_stops_at_the_first_non_finite_batch():
    corpus = EncodedCorpus.from_sentences(planted_corpus(200))
    vocab = corpus.build_vocabulary(min_count=1)
    config = GloVeConfig(dim=8, window=3, min_count=1, epochs=3, lr=1e20, batch_size=64, workers=1)
    epochs = []
    with pytest.raises(LmforgeError, match=r"GloVe diverged: the loss became (nan|inf) in epoch 1 .*were not saved.*"
                                           r"lower it \(lr, --lr; now 1e\+20"):
        train_glove(corpus, vocab, config, on_epoch=epochs.append)
    assert epochs == []  # no epoch was reported: the fit stopped inside the first one
