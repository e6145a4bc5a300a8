"""Word2Vec: vocabulary and corpus streaming, sampling distributions, the batched update against autograd,
and planted synonyms."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from lmforge.embeddings import sgns
from lmforge.embeddings.vocab import EncodedCorpus, Vocabulary, encode_corpus
from lmforge.embeddings.word2vec import (
    ARCHITECTURES,
    CBOW,
    BlockBatch,
    NoiseSampler,
    SkipGram,
    Word2VecConfig,
    keep_probabilities,
    make_blocks,
    noise_distribution,
    parse_device,
    subsample,
    train_word2vec,
)
from lmforge.errors import InputFileError, LmforgeError
from tests.embeddings.synthetic import planted_corpus, planted_ranks_above_random

needs_kernel = pytest.mark.skipif(not sgns.available(), reason="the compiled Word2Vec loop was not built (no C "
                                  "compiler when lmforge was installed)")


# ---------------------------------------------------------------------------------------------- vocabulary, corpus
def test_vocabulary_min_count_and_order():
    vocab = Vocabulary.from_counts({"b": 3, "a": 5, "c": 1, "d": 3}, min_count=2)
    assert vocab.words == ["a", "b", "d"]  # by count, ties in first-appearance order
    assert vocab.counts.tolist() == [5, 3, 3]
    assert vocab.index["d"] == 2 and vocab.total_words == 12 and vocab.kept_words == 11


def test_vocabulary_errors():
    with pytest.raises(InputFileError, match="no words"):
        Vocabulary.from_counts({}, min_count=1)
    with pytest.raises(LmforgeError, match=r"min_count=4 removes every word.*occurs 3 time"):
        Vocabulary.from_counts({"a": 3, "b": 1}, min_count=4)
    with pytest.raises(LmforgeError, match="at least 1"):
        Vocabulary.from_counts({"a": 3}, min_count=0)


def test_encode_corpus_streams_sentences(tmp_path):
    (tmp_path / "a.txt").write_text("The cat sat.\n\nThe dog, the cat!\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("A cat.\n", encoding="utf-8")
    with encode_corpus([tmp_path]) as corpus:
        workdir = corpus.workdir
        assert isinstance(corpus.ids, np.memmap)
        assert corpus.total_words == 9 and corpus.n_sentences == 3  # punctuation dropped, blank line skipped
        vocab = corpus.build_vocabulary(min_count=2)
        assert vocab.words == ["the", "cat"]
        chunks = list(corpus.chunks(max_words=2))
        # whole sentences only: each chunk ends at a sentence boundary even when max_words is smaller
        assert [c[2] for c in chunks] == [3, 4, 2]
        ids = np.concatenate([c[0] for c in chunks])
        sentence = np.concatenate([c[1] for c in chunks])
        assert [vocab.words[i] for i in ids] == ["the", "cat", "the", "the", "cat", "cat"]
        assert sentence.tolist() == [0, 0, 1, 1, 1, 2]
    assert workdir is not None and not workdir.exists()


def test_encode_corpus_empty(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n...\n", encoding="utf-8")
    with pytest.raises(InputFileError, match="holds no words"):
        encode_corpus([tmp_path / "empty.txt"])


# ---------------------------------------------------------------------------------------------- sampling
def test_noise_distribution_is_count_pow_075_normalised():
    counts = np.array([100, 20, 5, 1])
    expected = counts ** 0.75 / (counts ** 0.75).sum()
    np.testing.assert_allclose(noise_distribution(counts), expected, rtol=1e-12)
    draws = NoiseSampler(counts).sample((200_000,), np.random.default_rng(0))
    freq = np.bincount(draws, minlength=4) / draws.size
    sigma = np.sqrt(expected * (1 - expected) / draws.size)
    assert np.all(np.abs(freq - expected) < 5 * sigma), (freq, expected)


def test_keep_probabilities_formula_and_sampling():
    counts = np.array([9000, 900, 90, 10])
    t = 1e-2
    f = counts / counts.sum()
    expected = np.minimum(1.0, np.sqrt(t / f) + t / f)  # the C tool's formula
    keep = keep_probabilities(counts, t)
    np.testing.assert_allclose(keep, expected)
    assert keep[0] == pytest.approx(np.sqrt(0.01 / 0.9) + 0.01 / 0.9) and keep[0] < 0.2 and keep[3] == 1.0
    np.testing.assert_array_equal(keep_probabilities(counts, 0.0), np.ones(4))
    ids = np.repeat(np.arange(4), 20_000)
    kept = subsample(ids, keep, np.random.default_rng(1))
    rate = np.array([kept[ids == w].mean() for w in range(4)])
    sigma = np.sqrt(keep * (1 - keep) / 20_000) + 1e-9
    assert np.all(np.abs(rate - keep) < 5 * sigma), (rate, keep)


def test_dynamic_window_and_sentence_boundaries():
    n, window = 20_000, 3
    ids = np.arange(n) % 50
    rows, centers, pairs = make_blocks(ids, np.zeros(n, np.int64), window, 4, np.random.default_rng(0))
    dist = np.arange(4 + 2 * window)[:, None] - window - np.arange(4)[None, :]
    counts = np.array([(pairs & (np.abs(dist) == d)).sum() for d in range(1, window + 1)])
    # distance d is inside a window drawn uniformly from 1..W with probability (W - d + 1) / W: 3 : 2 : 1
    np.testing.assert_allclose(counts / counts[0], [1, 2 / 3, 1 / 3], atol=0.02)
    # pairs never cross a sentence boundary
    sentence = np.repeat(np.arange(n // 5), 5)
    _, _, pairs = make_blocks(ids, sentence, window, 4, np.random.default_rng(0))
    assert pairs.sum(axis=(1, 2)).max() <= 4 * 4  # each centre has at most 4 neighbours in a 5-word sentence
    n_pairs = pairs.sum()
    assert n_pairs < 0.8 * counts.sum() and n_pairs > 0


def _tiny_batch(share: int, seed: int = 0, vocab: int = 13) -> BlockBatch:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=37)
    sentence = np.repeat(np.arange(5), 8)[:37]
    rows, centers, pairs = make_blocks(ids, sentence, 3, share, rng)
    negatives = rng.integers(0, vocab, size=(len(centers), 4))
    negatives[0, 0] = centers[0, 0]  # a negative equal to its target: skipped
    return BlockBatch(torch.from_numpy(rows), torch.from_numpy(np.concatenate([centers, negatives], 1)),
                      torch.from_numpy(pairs))


@pytest.mark.parametrize("share", [1, 3])
def test_skipgram_step_is_sgd_on_pair_loss(share):
    torch.manual_seed(0)
    model = SkipGram(13, 7)
    model.output_vectors.data.normal_()  # zero output vectors would hide half of the gradient
    batch = _tiny_batch(share)
    with torch.enable_grad():
        model.requires_grad_(True)
        loss, n_pairs = model.pair_loss(batch)
        loss.backward()
        model.requires_grad_(False)
    before_in, before_out = model.input_vectors.clone(), model.output_vectors.clone()
    step_loss, step_pairs = model.sgd_step(batch, lr=0.1)
    assert step_pairs == n_pairs == int(batch.pairs.sum()) and step_loss == pytest.approx(loss.item(), rel=1e-5)
    torch.testing.assert_close(model.input_vectors - before_in, -0.1 * model.input_vectors.grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(model.output_vectors - before_out, -0.1 * model.output_vectors.grad, atol=1e-6,
                               rtol=0)


def test_skipgram_damps_only_the_rows_used_more_than_the_cap():
    torch.manual_seed(0)
    model = SkipGram(5, 7, max_row_updates=6.0)  # 5 words: every word is used many times in the batch
    model.output_vectors.data.normal_()
    batch = _tiny_batch(3, vocab=5)
    with torch.enable_grad():
        model.requires_grad_(True)
        model.pair_loss(batch)[0].backward()
        model.requires_grad_(False)
    g = batch.share  # count each word's uses by enumerating the pairs
    block, row, col = batch.pairs.nonzero(as_tuple=True)
    context, center, negatives = batch.rows[block, row], batch.targets[block, col], batch.targets[block, g:]
    uses_in = torch.bincount(context, minlength=5).float()
    uses_out = (torch.bincount(center, minlength=5)
                + torch.bincount(negatives[negatives != center[:, None]], minlength=5)).float()
    assert (uses_in > 6).any() and (uses_out > 6).any()
    before_in, before_out = model.input_vectors.clone(), model.output_vectors.clone()
    model.sgd_step(batch, lr=0.1)
    for moved, grad, uses in ((model.input_vectors - before_in, model.input_vectors.grad, uses_in),
                              (model.output_vectors - before_out, model.output_vectors.grad, uses_out)):
        scale = (6.0 / uses.clamp(min=6.0))[:, None]  # 1 for rows at or below the cap
        torch.testing.assert_close(moved, -0.1 * grad * scale, atol=1e-6, rtol=0)


@pytest.mark.parametrize("bound", [6.0, 10.0])
def test_skipgram_damps_only_the_rows_whose_summed_step_would_overshoot(bound):
    torch.manual_seed(0)
    model = SkipGram(5, 7, max_row_curvature=bound)  # 5 words: every word is used many times in the batch
    model.input_vectors.data.normal_()
    model.output_vectors.data.normal_()
    batch, lr = _tiny_batch(3, vocab=5), 0.1
    with torch.enable_grad():
        model.requires_grad_(True)
        model.pair_loss(batch)[0].backward()
        model.requires_grad_(False)
    # each row's curvature, pair by pair: lr * sigma'(s) * |vector on the other side|^2 over the scores it is in
    g = batch.share
    block, row, col = batch.pairs.nonzero(as_tuple=True)
    context, center, negatives = batch.rows[block, row], batch.targets[block, col], batch.targets[block, g:]
    x, t = model.input_vectors, model.output_vectors
    curv_in, curv_out = torch.zeros(5), torch.zeros(5)
    for c, o, negs in zip(context.tolist(), center.tolist(), negatives.tolist(), strict=True):
        for target in [o] + [n for n in negs if n != o]:
            sig = torch.sigmoid(x[c] @ t[target])
            curv_in[c] += lr * sig * (1 - sig) * t[target].square().sum()
            curv_out[target] += lr * sig * (1 - sig) * x[c].square().sum()
    assert all((curv > bound).any() and (curv < bound).any() for curv in (curv_in, curv_out))  # damped and not
    before_in, before_out = x.clone(), t.clone()
    model.sgd_step(batch, lr=lr)
    for moved, grad, curv in ((x - before_in, x.grad, curv_in), (t - before_out, t.grad, curv_out)):
        scale = (bound / curv.clamp(min=bound))[:, None]  # 1 (the plain SGD step) for rows at or below the bound
        torch.testing.assert_close(moved, -lr * grad * scale, atol=1e-6, rtol=1e-5)


def test_cbow_step_follows_the_c_tool():
    torch.manual_seed(0)
    model = CBOW(13, 7)
    model.output_vectors.data.normal_()
    batch = _tiny_batch(3, seed=1)
    with torch.enable_grad():
        model.requires_grad_(True)
        loss, n = model.center_loss(batch)
        loss.backward()
        model.requires_grad_(False)
    # the C tool adds the error of the mean h to every context vector unscaled: d loss / d h per centre, which
    # autograd gives for the context vectors divided by the number of context words
    expected_in = torch.zeros_like(model.input_vectors)
    g = batch.share
    for k in range(batch.rows.shape[0]):
        for j in range(g):
            ctx = batch.rows[k][batch.pairs[k, :, j]]
            if len(ctx) == 0:
                continue
            h = model.input_vectors[ctx].mean(0).requires_grad_(True)
            with torch.enable_grad():
                center, negatives = batch.targets[k, j], batch.targets[k, g:]
                s_neg = model.output_vectors[negatives] @ h
                term = -torch.nn.functional.logsigmoid(model.output_vectors[center] @ h) - (
                    torch.nn.functional.logsigmoid(-s_neg) * (negatives != center)).sum()
                (dh,) = torch.autograd.grad(term, h)
            expected_in.index_add_(0, ctx, dh.expand(len(ctx), -1))
    before_in, before_out = model.input_vectors.clone(), model.output_vectors.clone()
    step_loss, step_n = model.sgd_step(batch, lr=0.1)
    assert step_n == n and step_loss == pytest.approx(loss.item(), rel=1e-5)
    torch.testing.assert_close(model.output_vectors - before_out, -0.1 * model.output_vectors.grad, atol=1e-6,
                               rtol=0)
    torch.testing.assert_close(model.input_vectors - before_in, -0.1 * expected_in, atol=1e-6, rtol=0)
    assert not torch.allclose(expected_in, model.input_vectors.grad)  # the rule differs from the exact gradient


# ---------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def planted():
    corpus = EncodedCorpus.from_sentences(planted_corpus(800))
    return corpus, corpus.build_vocabulary(min_count=1)


@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=needs_kernel)])
@pytest.mark.parametrize("architecture", ["skipgram", "cbow"])
def test_planted_synonyms_rank_above_random_pairs(planted, architecture, mode):
    corpus, vocab = planted
    config = Word2VecConfig(architecture=architecture, mode=mode, dim=16, window=3, negative=5, min_count=1, sample=0,
                            epochs=8, batch_size=128, workers=1, seed=3)
    result = train_word2vec(corpus, vocab, config)
    lowest_planted, highest_random = planted_ranks_above_random(result.vectors.similarity)
    assert lowest_planted > highest_random, (lowest_planted, highest_random)
    losses = [e.loss for e in result.epochs]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert all(e.words == corpus.total_words for e in result.epochs)
    assert result.epochs[-1].lr_end < config.alpha / 5  # decayed linearly towards min_alpha


@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=needs_kernel)])
def test_training_is_reproducible_and_lr_decays(planted, mode):
    corpus, vocab = planted
    config = Word2VecConfig(mode=mode, dim=8, window=2, min_count=1, epochs=2, batch_size=32, workers=1, seed=5)
    a, b = train_word2vec(corpus, vocab, config), train_word2vec(corpus, vocab, config)
    np.testing.assert_array_equal(a.vectors.vectors, b.vectors.vectors)
    # epoch 1 ends half way: lr = alpha - (alpha - min_alpha) * 1/2, to within one chunk's share
    mid = config.alpha - (config.alpha - config.min_alpha) * 0.5
    assert a.epochs[0].lr_end == pytest.approx(mid, rel=0.05)
    c = train_word2vec(corpus, vocab, Word2VecConfig(**{**config.__dict__, "workers": 2}))
    assert c.vectors.vectors.shape == a.vectors.vectors.shape and np.isfinite(c.epochs[-1].loss)


@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=needs_kernel)])
def test_training_without_any_pair_is_an_error(mode):
    corpus = EncodedCorpus.from_sentences([["alone"], ["single"], ["alone"]])
    vocab = corpus.build_vocabulary(min_count=1)
    with pytest.raises(LmforgeError, match="no \\(context, centre\\) pair"):
        train_word2vec(corpus, vocab, Word2VecConfig(mode=mode, min_count=1, epochs=1, workers=1))


def _bbc_word_pieces(bbc_dir, files: int = 100) -> list[list[str]]:
    """BBC News lines cut into word pieces as a likelihood-trained WordPiece vocabulary cuts most words ("th ##e",
    README, section 1): a word's first character, then "##" + each following one. 100 files give about 150,000
    pieces of 90 kinds, every one of them frequent."""
    from lmforge.data.text import collect_text_files, read_texts

    return [[piece for word in line.split() for piece in [word[0], *("##" + ch for ch in word[1:])]]
            for _, text in read_texts(collect_text_files([bbc_dir])[:files]) for line in text.lower().splitlines()
            if line.split()]


def test_fast_mode_trains_word_pieces_at_gensims_learning_rate(bbc_dir):
    """Issue 23: on word pieces the batched mode at alpha 0.025 ended with loss nan and NaN vectors (exit 0). Every
    piece takes part in hundreds of pairs per batch, and their summed stale updates overshot; the curvature bound
    (``max_row_curvature``) keeps each summed step inside the local quadratic model."""
    corpus = EncodedCorpus.from_sentences(_bbc_word_pieces(bbc_dir))
    vocab = corpus.build_vocabulary(min_count=5)
    config = Word2VecConfig(mode="fast", epochs=2, workers=1, seed=1)
    # the damping before the fix (by use counts alone) diverges; training now stops at the first non-finite loss
    with pytest.raises(LmforgeError, match=r"word2vec diverged: the loss became (nan|inf) in epoch 1 .*were not saved"
                                           r".*--lr; now 0.025"):
        train_word2vec(corpus, vocab, dataclasses.replace(config, max_row_curvature=None))
    for architecture in ARCHITECTURES:
        result = train_word2vec(corpus, vocab, dataclasses.replace(config, architecture=architecture))
        losses = [e.loss for e in result.epochs]
        assert np.isfinite(result.vectors.vectors).all() and all(math.isfinite(v) for v in losses)
        assert losses[-1] < losses[0] < 3.5, (architecture, losses)  # it learns (the first batches start at 4.2)


@needs_kernel
def test_exact_mode_stops_at_the_first_non_finite_loss(planted):
    corpus, vocab = planted
    config = Word2VecConfig(mode="exact", dim=8, min_count=1, epochs=3, alpha=50.0, min_alpha=0.0, workers=1)
    epochs = []
    with pytest.raises(LmforgeError, match=r"word2vec diverged: the loss became nan in epoch 1 .*lower the learning "
                                           r"rate \(alpha, --lr; now 50\)"):
        train_word2vec(corpus, vocab, config, on_epoch=epochs.append)
    assert epochs == []  # stopped inside the first epoch, not at its end


def test_config_validation():
    with pytest.raises(LmforgeError, match="architecture='sgns'"):
        Word2VecConfig(architecture="sgns")
    with pytest.raises(LmforgeError, match="window=0"):
        Word2VecConfig(window=0)
    with pytest.raises(LmforgeError, match="sample"):
        Word2VecConfig(sample=1.5)
    with pytest.raises(LmforgeError, match="max_row_curvature=0"):
        Word2VecConfig(max_row_curvature=0)


def test_device_errors():
    with pytest.raises(LmforgeError, match="not a torch device"):
        parse_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(LmforgeError, match="CUDA is not available"):
            parse_device("cuda")
