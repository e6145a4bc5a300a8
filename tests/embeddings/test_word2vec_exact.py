"""Word2Vec's exact mode: the compiled per-pair loop (lmforge/embeddings/_sgns.c) against a pure-Python version of
the C tool's algorithm that replays the same random stream, plus its noise table, errors and threads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmforge.embeddings import sgns
from lmforge.embeddings.vocab import EncodedCorpus
from lmforge.embeddings.word2vec import Word2VecConfig, keep_probabilities, noise_distribution, train_word2vec
from lmforge.errors import LmforgeError
from tests.embeddings.synthetic import planted_corpus, planted_ranks_above_random

pytestmark = pytest.mark.skipif(not sgns.available(), reason="the compiled Word2Vec loop was not built (no C compiler "
                                "when lmforge was installed)")

MASK = (1 << 64) - 1


class SplitMix64:
    """The C loop's random stream, replayed."""

    def __init__(self, seed: int) -> None:
        self.state = seed

    def u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def unit(self) -> float:
        return (self.u64() >> 11) / 9007199254740992.0


def reference_chunk(syn0, syn1, ids, sentence, keep_prob, noise, window, negative, cbow, lr_start, lr_end, seed):
    """The C tool's training loop, one pair at a time, in float64 (the loop under test works in float32)."""
    rng = SplitMix64(seed)
    prob, alias = noise
    vocab = syn0.shape[0]
    n = len(ids)
    kept = []
    for i in range(n):
        w = int(ids[i])
        if keep_prob is not None and keep_prob[w] < 1.0 and rng.unit() >= keep_prob[w]:
            continue
        kept.append((w, int(sentence[i]), lr_start + (lr_end - lr_start) * (i / n)))

    def draw():
        u = rng.unit() * vocab
        k = min(int(u), vocab - 1)
        return k if (u - k) < prob[k] else int(alias[k])

    def train(l1, word, neu1e, lr):
        loss = 0.0
        targets = [(word, 1.0)]
        for _ in range(negative):
            t = draw()
            if t != word:
                targets.append((t, 0.0))
        for t, label in targets:
            f = float(l1 @ syn1[t])
            g = (label - 1 / (1 + math.exp(-f))) * lr
            neu1e += g * syn1[t]
            syn1[t] += g * l1
            loss += math.log1p(math.exp(-f if label else f))
        return loss

    loss, count = 0.0, 0
    for i, (word, sent, lr) in enumerate(kept):
        b = 1 + rng.u64() % window
        context = [j for j in range(max(0, i - b), min(len(kept), i + b + 1)) if j != i and kept[j][1] == sent]
        if not cbow:
            for j in context:
                neu1e = np.zeros(syn0.shape[1])
                loss += train(syn0[kept[j][0]], word, neu1e, lr)  # a view: updates after the pair
                syn0[kept[j][0]] += neu1e
                count += 1
        elif context:
            h = np.mean([syn0[kept[j][0]] for j in context], axis=0)
            neu1e = np.zeros(syn0.shape[1])
            loss += train(h, word, neu1e, lr)
            for j in context:
                syn0[kept[j][0]] += neu1e
            count += 1
    return loss, count


@pytest.mark.parametrize("cbow", [False, True])
@pytest.mark.parametrize("sample", [0.0, 0.05])
def test_compiled_loop_equals_the_reference_algorithm(cbow, sample):
    rng = np.random.default_rng(0)
    vocab, dim, n = 12, 8, 120
    counts = rng.integers(1, 50, size=vocab)
    ids = rng.integers(0, vocab, size=n).astype(np.int64)
    sentence = np.repeat(np.arange(6), 20).astype(np.int64)
    syn0 = ((rng.random((vocab, dim)) - 0.5) / dim).astype(np.float32)
    syn1 = (rng.standard_normal((vocab, dim)) * 0.1).astype(np.float32)
    keep = keep_probabilities(counts, sample) if sample else None
    noise = sgns.alias_table(noise_distribution(counts))
    args = dict(window=3, negative=4, cbow=cbow, lr_start=0.05, lr_end=0.01, seed=1234)
    ref0, ref1 = syn0.astype(np.float64), syn1.astype(np.float64)
    start1 = syn1.copy()
    ref_loss, ref_count = reference_chunk(ref0, ref1, ids, sentence, keep, noise, args["window"], args["negative"],
                                          cbow, args["lr_start"], args["lr_end"], args["seed"])
    loss, count = sgns.train_chunk(syn0, syn1, ids, sentence, keep, noise, **args)
    assert count == ref_count > 0
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_allclose(syn0, ref0, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(syn1, ref1, rtol=1e-4, atol=1e-6)
    assert np.abs(syn1 - start1).max() > 1e-3  # the comparison is not between two untouched tables


def test_alias_table_encodes_the_distribution_exactly():
    p = noise_distribution(np.array([1000, 1, 1, 50, 7, 7, 300, 2]))
    prob, alias = sgns.alias_table(p)
    v = len(p)
    implied = prob / v  # P(k) = (prob[k] + sum over j aliased to k of (1 - prob[j])) / V
    np.add.at(implied, alias, (1 - prob) / v)
    np.testing.assert_allclose(implied, p, rtol=1e-12, atol=1e-15)
    assert ((prob >= 0) & (prob <= 1)).all() and ((alias >= 0) & (alias < v)).all()


def test_chunk_input_errors():
    syn = np.zeros((3, 4), np.float32)
    noise = sgns.alias_table(np.ones(3) / 3)
    with pytest.raises(LmforgeError, match=r"in \[0, 3\)"):
        sgns.train_chunk(syn, syn.copy(), np.array([0, 5]), np.array([0, 0]), None, noise, window=2, negative=1,
                         cbow=False, lr_start=0.1, lr_end=0.1, seed=1)


@pytest.fixture(scope="module")
def planted():
    corpus = EncodedCorpus.from_sentences(planted_corpus(800))
    return corpus, corpus.build_vocabulary(min_count=1)


@pytest.mark.parametrize("workers", [1, 2])
def test_exact_mode_learns_and_one_worker_is_deterministic(planted, workers):
    corpus, vocab = planted
    config = Word2VecConfig(mode="exact", dim=16, window=3, min_count=1, sample=0, epochs=5, workers=workers,
                            seed=3, chunk_words=500)
    a = train_word2vec(corpus, vocab, config)
    lowest_planted, highest_random = planted_ranks_above_random(a.vectors.similarity)
    assert lowest_planted > highest_random, (lowest_planted, highest_random)
    assert a.epochs[-1].loss < a.epochs[0].loss
    if workers == 1:
        b = train_word2vec(corpus, vocab, config)
        np.testing.assert_array_equal(a.vectors.vectors, b.vectors.vectors)
        c = train_word2vec(corpus, vocab, Word2VecConfig(**{**config.__dict__, "seed": 4}))
        assert not np.array_equal(a.vectors.vectors, c.vectors.vectors)


def test_exact_mode_errors(planted, monkeypatch):
    corpus, vocab = planted
    with pytest.raises(LmforgeError, match="mode='slow'; choose one of exact, fast"):
        Word2VecConfig(mode="slow")
    monkeypatch.setattr(sgns, "_library", lambda: None)
    with pytest.raises(LmforgeError, match="--mode fast"):
        train_word2vec(corpus, vocab, Word2VecConfig(mode="exact", min_count=1, epochs=1, workers=1))
    # the fast mode needs no compiled code
    result = train_word2vec(corpus, vocab, Word2VecConfig(mode="fast", dim=8, min_count=1, epochs=1, workers=1))
    assert np.isfinite(result.epochs[0].loss)
