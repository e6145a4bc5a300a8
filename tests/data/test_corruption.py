"""BART's corruptions (lmforge.data.corruption): their statistics over many draws, determinism, and the denoising
data stream's exact resumption."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig
from lmforge.data.corruption import (
    Corruption,
    DenoisingData,
    UnigramSampler,
    delete_tokens,
    infill_spans,
    permute_sentences,
    rotate_document,
    substitute_tokens,
)
from lmforge.errors import LmforgeError

MASK = 4
V = 99


def text(T: int = 101, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """[CLS] T-2 text tokens [SEP] (ids 5..98, distinct where possible) and its candidates mask."""
    rng = np.random.default_rng(seed)
    ids = np.concatenate([[2], rng.integers(5, V, size=T - 2), [3]]).astype(np.int64)
    candidates = np.ones(T, dtype=bool)
    candidates[[0, -1]] = False
    return ids, candidates


def test_substitution_rate_positions_and_unigram_distribution():
    ids, cand = text(51)
    counts = np.zeros(V)
    counts[10:20] = np.arange(1, 11)  # id 10 + j drawn with probability (j + 1) / 55
    sampler = UnigramSampler(counts, exclude=[19])  # 19 is excluded: the rest renormalised over 45
    hits = np.zeros(len(ids))
    drawn = []
    for seed in range(400):
        out, positions = substitute_tokens(ids, candidates=cand, rate=0.2, rng=np.random.default_rng(seed),
                                           replacement=sampler)
        assert len(positions) == round(0.2 * 49) == 10 and cand[positions].all()
        assert np.array_equal(out[~np.isin(np.arange(len(ids)), positions)], ids[~np.isin(np.arange(len(ids)),
                                                                                            positions)])
        hits[positions] += 1
        drawn.append(out[positions])
    freq = hits[1:-1] / 400
    assert abs(freq.mean() - 10 / 49) < 1e-9 and freq.min() > 0.12 and freq.max() < 0.3  # uniform over candidates
    drawn = np.concatenate(drawn)
    expected = counts.copy()
    expected[19] = 0
    expected /= expected.sum()
    observed = np.bincount(drawn, minlength=V) / len(drawn)
    assert np.abs(observed - expected).max() < 0.02 and observed[19] == 0
    np.testing.assert_allclose(sampler.probabilities, expected)


def test_substitution_takes_any_replacement_callable():
    ids, cand = text(21)
    out, positions = substitute_tokens(ids, candidates=cand, rate=0.5, rng=np.random.default_rng(0),
                                       replacement=lambda pos, rng: pos + 1000)  # e.g. a generator's samples
    assert np.array_equal(out[positions], positions + 1000) and len(positions) == 10
    with pytest.raises(LmforgeError, match="gave"):
        substitute_tokens(ids, candidates=cand, rate=0.5, rng=np.random.default_rng(0),
                          replacement=lambda pos, rng: pos[:1])


def test_deletion_rate_and_what_is_left():
    ids, cand = text(81)
    hits = np.zeros(len(ids))
    for seed in range(300):
        out, positions = delete_tokens(ids, candidates=cand, rate=0.15, rng=np.random.default_rng(seed))
        assert len(positions) == round(0.15 * 79) == 12 and len(out) == len(ids) - 12
        keep = np.ones(len(ids), dtype=bool)
        keep[positions] = False
        assert np.array_equal(out, ids[keep]) and out[0] == 2 and out[-1] == 3
        hits[positions] += 1
    assert hits[0] == hits[-1] == 0
    assert abs(hits[1:-1].mean() / 300 - 12 / 79) < 1e-9 and hits[1:-1].min() > 0.07 * 300


def test_infilling_poisson_lengths_rate_and_one_mask_per_span():
    ids, cand = text(402)
    lengths, n_spans, inserted = [], 0, 0
    for seed in range(150):
        out = infill_spans(ids, candidates=cand, rate=0.3, rng=np.random.default_rng(seed), mask_id=MASK)
        spans = out.spans
        sizes = spans[:, 1] - spans[:, 0]
        assert sizes.sum() == round(0.3 * 400) == 120  # exactly the budget is masked
        lengths += sizes[:-1].tolist()  # the last span is trimmed to the budget
        n_spans += len(spans)
        inserted += int((sizes == 0).sum())
        assert (out.input_ids == MASK).sum() == len(spans)  # one [MASK] per span, insertions included
        assert len(out.input_ids) == len(ids) - 120 + len(spans)
        assert out.input_ids[0] == 2 and out.input_ids[-1] == 3
        masked = np.zeros(len(ids), dtype=int)
        for s, e in spans[sizes > 0]:
            masked[s:e] += 1
        assert masked.max() == 1 and not masked[~cand].any()  # no overlap, no special token inside
        # the unmasked tokens are kept in order, each mask stands where its span was
        rebuilt, at = [], 0
        for s, e in sorted(spans.tolist(), key=lambda x: (x[0], x[1] > x[0])):
            rebuilt += ids[at:s].tolist() + [MASK]
            at = max(at, e)
        assert rebuilt + ids[at:].tolist() == out.input_ids.tolist()
    lengths = np.array(lengths)
    assert abs(lengths.mean() - 3.0) < 0.12  # Poisson(3); ~5,900 lengths, sd of the mean 0.02
    assert abs((lengths == 0).mean() - math.exp(-3)) < 0.015
    assert abs(lengths.var() - 3.0) < 0.3
    assert inserted > 0 and n_spans > 0


def test_infilling_insertions_fit_max_length_and_short_texts():
    ids, cand = text(12)
    for seed in range(200):
        out = infill_spans(ids, candidates=cand, rate=0.3, rng=np.random.default_rng(seed), mask_id=MASK,
                           poisson_lambda=0.2, max_length=12)  # mostly zero-length spans: insertions
        assert len(out.input_ids) <= 12
    out = infill_spans(ids, candidates=cand, rate=0.0, rng=np.random.default_rng(0), mask_id=MASK)
    assert np.array_equal(out.input_ids, ids) and len(out.spans) == 0
    full = infill_spans(ids, candidates=cand, rate=1.0, rng=np.random.default_rng(0), mask_id=MASK)
    assert full.input_ids[0] == 2 and full.input_ids[-1] == 3 and set(full.input_ids[1:-1]) == {MASK}


def test_sentence_permutation_is_a_permutation_of_whole_sentences():
    sentences = [[10, 11, 12], [20], [30, 31], [40, 41, 42, 43]]
    ids = np.array([2, *sum(sentences, []), 3])
    bounds = np.cumsum([1, *map(len, sentences)])
    seen = {}
    for seed in range(600):
        out, order = permute_sentences(ids, bounds, np.random.default_rng(seed))
        assert sorted(order.tolist()) == [0, 1, 2, 3]
        assert out.tolist() == [2, *sum((sentences[j] for j in order), []), 3]
        seen[tuple(order)] = seen.get(tuple(order), 0) + 1
    assert len(seen) == 24 and min(seen.values()) > 10 and max(seen.values()) < 45  # uniform: 25 each
    out, order = permute_sentences(ids, bounds, np.random.default_rng(0), share=0.5)  # 2 of 4 sentences move
    assert (order != np.arange(4)).sum() in (0, 2)
    assert np.array_equal(permute_sentences(ids, bounds, np.random.default_rng(0), share=0.0)[0], ids)


def test_rotation_keeps_the_multiset_and_starts_uniformly():
    ids, cand = text(12)
    starts = np.zeros(len(ids))
    for seed in range(1000):
        out, start = rotate_document(ids, candidates=cand, rng=np.random.default_rng(seed))
        assert sorted(out.tolist()) == sorted(ids.tolist()) and out[0] == 2 and out[-1] == 3
        assert out[1] == ids[start] and out[1:-1].tolist() == ids[start:-1].tolist() + ids[1:start].tolist()
        starts[start] += 1
    assert starts[0] == starts[-1] == 0 and starts[1:-1].min() > 60 and starts[1:-1].max() < 145  # 100 each


def test_the_mix_is_deterministic_and_each_rate_is_validated():
    ids, _ = text(61)
    is_special = np.zeros(V, dtype=bool)
    is_special[[0, 1, 2, 3, MASK]] = True
    bounds = np.array([1, 20, 41, 60])
    mix = Corruption(permute_sentences=1.0, rotate_prob=0.5, infill_rate=0.3, token_mask_rate=0.1,
                     substitute_rate=0.1, delete_rate=0.1)
    sampler = UnigramSampler(np.ones(V), exclude=np.flatnonzero(is_special))

    def run(seed: int) -> np.ndarray:
        return mix.apply(ids, rng=np.random.default_rng(seed), is_special=is_special, mask_id=MASK,
                         sentence_bounds=bounds, replacement=sampler)

    assert np.array_equal(run(5), run(5)) and not np.array_equal(run(5), run(6))
    assert run(5)[0] == 2 and run(5)[-1] == 3
    with pytest.raises(LmforgeError, match="infill_rate=1.5"):
        Corruption(infill_rate=1.5)
    with pytest.raises(LmforgeError, match="poisson_lambda=0"):
        Corruption(poisson_lambda=0)
    with pytest.raises(LmforgeError, match="needs the sentence bounds"):
        Corruption(permute_sentences=1.0).apply(ids, rng=np.random.default_rng(0), is_special=is_special,
                                                mask_id=MASK)
    with pytest.raises(LmforgeError, match="delete_rate=-0.1 must be in"):
        DataConfig(delete_rate=-0.1)


def _denoise_config(**over) -> DataConfig:
    return DataConfig(objective="denoise", seq_len=40, eval_fraction=0.1, **over)


def _take(data: DenoisingData, n: int) -> list[dict[str, torch.Tensor]]:
    it = data.batches(3)
    return [next(it) for _ in range(n)]


def test_denoising_batches_resume_exactly(corpus, tokenizer):
    cfg = _denoise_config(rotate_prob=0.3, substitute_rate=0.05, delete_rate=0.05)
    first = DenoisingData(corpus, cfg, tokenizer, seed=7)
    per_epoch = first.examples_per_epoch() // 3
    whole = _take(DenoisingData(corpus, cfg, tokenizer, seed=7), per_epoch + 3)  # into the second epoch
    head = _take(first, per_epoch - 1)
    resumed = DenoisingData(corpus, cfg, tokenizer, seed=7)
    resumed.load_state_dict(first.state_dict())
    for a, b in zip(whole, head + _take(resumed, 4), strict=True):
        assert a.keys() == b.keys() == {"src_ids", "src_mask", "tgt_ids", "tgt_mask", "labels"}
        for k in a:
            assert torch.equal(a[k], b[k]), k
    other = _take(DenoisingData(corpus, cfg, tokenizer, seed=8), 1)[0]
    assert not torch.equal(other["src_ids"], whole[0]["src_ids"])


def test_denoising_examples_are_corrupted_segments(corpus, tokenizer):
    data = DenoisingData(corpus, _denoise_config(permute_sentences=0.0), tokenizer, seed=0)  # infilling only
    plan = data._plan(0)
    for i in range(len(plan)):
        ((doc, s, e),) = plan[i]
        ex = data._example(plan, i, 0)
        original = [tokenizer.cls_id, *corpus.document_tokens(doc)[s:e].tolist(), tokenizer.sep_id]
        assert ex["tgt_ids"].tolist() == original and len(original) <= 40
        src = ex["src_ids"]
        assert src[0] == tokenizer.cls_id and src[-1] == tokenizer.sep_id and len(src) <= 40
        assert (src == tokenizer.mask_id).any() == (round(0.3 * (len(original) - 2)) > 0)
    batch = next(data.batches(3))
    # teacher forcing: the decoder reads [CLS] y and predicts y [SEP]
    assert (batch["tgt_ids"][:, 0] == tokenizer.cls_id).all()
    first = batch["labels"][0][batch["labels"][0] != -100]
    assert first[-1] == tokenizer.sep_id and torch.equal(first[:-1], batch["tgt_ids"][0, 1:len(first)])
    permuted = DenoisingData(corpus, _denoise_config(infill_rate=0.0), tokenizer, seed=0)  # permutation only
    for i in range(len(plan)):
        ex = permuted._example(plan, i, 0)
        assert sorted(ex["src_ids"].tolist()) == sorted(ex["tgt_ids"].tolist())
    with pytest.raises(LmforgeError, match="only teach the model to copy"):
        DenoisingData(corpus, _denoise_config(infill_rate=0.0, permute_sentences=0.0), tokenizer)
