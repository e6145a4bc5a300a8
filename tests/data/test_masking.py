"""Masking strategies: statistics over many draws, whole-word groups, SpanBERT span lengths and boundaries."""

import numpy as np
import pytest

from lmforge.data.masking import (
    IGNORE_INDEX,
    continuation_mask,
    mask_budget,
    mask_tokens,
    ngram_length_pmf,
    span_length_pmf,
    word_start_mask,
)
from lmforge.errors import LmforgeError

V = 99
SPECIAL = np.array([0, 1, 2, 3, 4])  # [PAD] [UNK] [CLS] [SEP] [MASK]
PAD, UNK, CLS, SEP, MASK = SPECIAL
NON_SPECIAL = np.arange(5, V)
IS_SPECIAL = np.isin(np.arange(V), SPECIAL)


def sequence(rng, n_text: int, n_pad: int, unk_every: int = 0) -> np.ndarray:
    """[CLS] text [SEP] [PAD]...; with ``unk_every``, some [UNK] and [MASK] ids inside the text."""
    text = rng.integers(5, V, size=n_text)
    if unk_every:
        text[::unk_every] = UNK
        text[1::unk_every * 2] = MASK
    return np.concatenate([[CLS], text, [SEP], np.full(n_pad, PAD)])


def masked(ids, rng, **options):
    return mask_tokens(ids, special_mask=IS_SPECIAL[ids], vocab_size=V, non_special_ids=NON_SPECIAL,
                       mask_id=MASK, rng=rng, **options)


def test_budget():
    assert mask_budget(100, 0.15, 20) == 15
    assert mask_budget(125, 0.15, 20) == 19
    assert mask_budget(300, 0.15, 20) == 20
    assert mask_budget(3, 0.15, 20) == 1  # at least one
    assert mask_budget(0, 0.15, 20) == 0
    assert mask_budget(10, 0.0, 20) == 0


@pytest.mark.parametrize("strategy", ["token", "whole_word", "span", "ngram"])
def test_specials_and_padding_never_selected_and_random_tokens_never_special(strategy):
    rng = np.random.default_rng(0)
    ids = sequence(rng, 90, 30, unk_every=9)
    word_starts = rng.random(len(ids)) < 0.6
    for _ in range(400):
        m = masked(ids, rng, strategy=strategy, word_starts=word_starts)
        chosen = m.labels != IGNORE_INDEX
        assert not (chosen & IS_SPECIAL[ids]).any()
        np.testing.assert_array_equal(m.input_ids[~chosen], ids[~chosen])
        np.testing.assert_array_equal(m.labels[chosen], ids[chosen])
        replaced = chosen & (m.input_ids != ids) & (m.input_ids != MASK)
        assert not IS_SPECIAL[m.input_ids[replaced]].any()


def test_token_masking_statistics():
    rng = np.random.default_rng(1)
    draws, n_text = 3000, 100
    ids = sequence(rng, n_text, 20)
    selected = np.zeros(len(ids))
    outcome = {"mask": 0, "random": 0, "same": 0}
    for _ in range(draws):
        m = masked(ids, rng)
        chosen = m.labels != IGNORE_INDEX
        assert chosen.sum() == 15  # round(0.15 * 100) of the non-special tokens
        selected += chosen
        new, old = m.input_ids[chosen], ids[chosen]
        outcome["mask"] += int((new == MASK).sum())
        outcome["same"] += int((new == old).sum())
        outcome["random"] += int(((new != MASK) & (new != old)).sum())
    rate = selected[1:n_text + 1] / draws  # each text position ~ 15%, uniformly
    assert abs(rate.mean() - 0.15) < 1e-9 and rate.min() > 0.11 and rate.max() < 0.19
    assert selected[0] == selected[n_text + 1:].sum() == 0
    total = sum(outcome.values())
    p_same_by_chance = 0.1 / len(NON_SPECIAL)  # a random replacement that draws the original id
    assert abs(outcome["mask"] / total - 0.8) < 0.01
    assert abs(outcome["random"] / total - (0.1 - p_same_by_chance)) < 0.01
    assert abs(outcome["same"] / total - (0.1 + p_same_by_chance)) < 0.01


def test_max_predictions_caps_and_ratios_are_options():
    rng = np.random.default_rng(2)
    ids = sequence(rng, 300, 0)
    counts = {"mask": 0, "random": 0}
    for _ in range(300):
        m = masked(ids, rng, max_predictions=20, mask_token_ratio=0.5, random_token_ratio=0.5)
        chosen = m.labels != IGNORE_INDEX
        assert chosen.sum() == 20
        counts["mask"] += int((m.input_ids[chosen] == MASK).sum())
        counts["random"] += int((m.input_ids[chosen] != MASK).sum())
    assert abs(counts["mask"] / 6000 - 0.5) < 0.03


def test_whole_word_groups_stay_intact():
    rng = np.random.default_rng(3)
    for _ in range(300):
        ids = sequence(rng, 120, 8)
        word_starts = rng.random(len(ids)) < 0.4  # long words of several pieces
        word_starts[1] = False  # a "##" piece right after [CLS] still starts a word
        m = masked(ids, rng, strategy="whole_word", word_starts=word_starts)
        chosen = m.labels != IGNORE_INDEX
        assert 0 < chosen.sum() <= 18
        # every word (a start plus the pieces after it, within the text) is all in or all out
        word_id = np.cumsum(word_starts | IS_SPECIAL[ids] | np.r_[True, IS_SPECIAL[ids][:-1]])
        for w in np.unique(word_id[chosen]):
            assert chosen[word_id == w].all()


def test_whole_word_pieces_get_their_own_replacement_draw():
    rng = np.random.default_rng(4)
    ids = sequence(rng, 60, 0)
    word_starts = np.zeros(len(ids), dtype=bool)
    word_starts[1::6] = True  # words of six pieces
    mixed = 0
    for _ in range(200):
        m = masked(ids, rng, strategy="whole_word", word_starts=word_starts)
        chosen = np.flatnonzero(m.labels != IGNORE_INDEX)
        is_mask = m.input_ids[chosen] == MASK
        mixed += bool(is_mask.any() and not is_mask.all())
    assert mixed > 100  # with one draw per word this would never happen


def test_continuation_mask(tokenizer):
    cont = continuation_mask(tokenizer)
    assert cont.shape == (tokenizer.vocab_size,)
    ids = tokenizer.encode_ids("rineduri sumisu")
    starts = word_start_mask(np.array(ids), cont)
    assert starts.tolist() == [not tokenizer.ids_to_tokens[i].startswith("##") for i in ids]
    assert starts.sum() == 2


def test_span_lengths_follow_the_clipped_geometric_law():
    rng = np.random.default_rng(5)
    pmf = span_length_pmf(0.2, 10)
    assert abs((np.arange(1, 11) * pmf).sum() - 3.8) < 0.01  # the paper's mean span length
    lengths = []
    for _ in range(150):
        ids = sequence(rng, 1500, 0)
        word_starts = rng.random(len(ids)) < 0.7
        m = masked(ids, rng, strategy="span", word_starts=word_starts, max_predictions=10_000)
        assert (m.labels != IGNORE_INDEX).sum() == round(0.15 * 1500)
        for start, end in m.spans[:-1]:  # the last span may be trimmed to the budget
            assert word_starts[start] or IS_SPECIAL[ids[start - 1]]
            lengths.append(int(word_starts[start:end].sum() + (not word_starts[start])))
    empirical = np.bincount(lengths, minlength=11)[1:] / len(lengths)
    assert len(lengths) > 5000
    assert 0.5 * np.abs(empirical - pmf).sum() < 0.05


def test_ngram_lengths_follow_albert_s_one_over_n_and_each_token_draws_its_own_replacement():
    np.testing.assert_allclose(ngram_length_pmf(3), [6 / 11, 3 / 11, 2 / 11])
    rng = np.random.default_rng(7)
    lengths, mixed, multi = [], 0, 0
    for _ in range(60):
        ids = sequence(rng, 1500, 0)
        m = masked(ids, rng, strategy="ngram", max_predictions=10_000)  # every token a word
        chosen = m.labels != IGNORE_INDEX
        assert chosen.sum() == round(0.15 * 1500)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], chosen.astype(int), [0]])))
        for start, end in zip(edges[::2], edges[1::2], strict=True):  # n-grams never touch: one run each
            lengths.append(end - start)
            if end - start > 1:
                multi += 1
                is_mask = m.input_ids[start:end] == MASK
                mixed += bool(is_mask.any() and not is_mask.all())
    assert max(lengths) <= 3 and len(lengths) > 5000
    empirical = np.bincount(lengths, minlength=4)[1:] / len(lengths)
    assert 0.5 * np.abs(empirical - ngram_length_pmf(3)).sum() < 0.03  # the last n-gram may be trimmed
    # per token, not per n-gram: P(a 2- or 3-gram is neither all [MASK] nor none) is about 0.3-0.5
    assert 0.2 < mixed / multi < 0.6
    # whole words: a 2-gram of words of 2 pieces covers 4 pieces
    ids = sequence(rng, 40, 0)
    word_starts = np.ones(len(ids), dtype=bool)
    word_starts[2::2] = False  # words of two pieces
    for _ in range(50):
        chosen = masked(ids, rng, strategy="ngram", word_starts=word_starts).labels != IGNORE_INDEX
        edges = np.flatnonzero(np.diff(np.concatenate([[0], chosen.astype(int), [0]])))
        for start, end in zip(edges[::2], edges[1::2], strict=True):
            assert word_starts[start] and (end == len(ids) - 1 or word_starts[end] or end - start < 2)
    with pytest.raises(LmforgeError, match="max_ngram=0"):
        masked(ids, rng, strategy="ngram", max_ngram=0)


def test_span_replacement_is_decided_per_span_and_boundaries_are_right():
    rng = np.random.default_rng(6)
    outcome = {"mask": 0, "random": 0, "same": 0}
    for _ in range(600):
        ids = sequence(rng, 100, 10)
        word_starts = rng.random(len(ids)) < 0.6
        m = masked(ids, rng, strategy="span", word_starts=word_starts)
        chosen = m.labels != IGNORE_INDEX
        assert chosen.sum() == 15
        covered = np.zeros(len(ids), dtype=bool)
        for start, end in m.spans:
            span = np.arange(start, end)
            assert not covered[start - 1:end + 1].any()  # spans neither overlap nor touch
            covered[span] = True
            sbo, rest = span[:10], span[10:]  # the SBO predicts a span's first max_span_len pieces (SpanBERT's code)
            assert (m.sbo_left[sbo] == start - 1).all() and (m.sbo_right[sbo] == end).all()
            assert m.sbo_offset[sbo].tolist() == list(range(len(sbo)))
            assert (m.sbo_left[rest] == -1).all() and (m.sbo_right[rest] == -1).all()
            assert (m.sbo_offset[rest] == 0).all()
            assert m.labels[start - 1] == IGNORE_INDEX and m.labels[end] == IGNORE_INDEX  # observed boundaries
            new, old = m.input_ids[span], ids[span]
            if (new == MASK).all():
                outcome["mask"] += 1
            elif (new == old).all():
                outcome["same"] += 1
            else:
                assert not (new == MASK).any()
                outcome["random"] += 1
        np.testing.assert_array_equal(covered, chosen)
        assert (m.sbo_left[~chosen] == -1).all() and (m.sbo_right[~chosen] == -1).all()
        assert (m.sbo_offset[~chosen] == 0).all()
    total = sum(outcome.values())
    assert abs(outcome["mask"] / total - 0.8) < 0.03
    assert abs(outcome["same"] / total - 0.1) < 0.025  # (a random span equal to the original is negligible)


def test_spans_never_cross_a_separator():
    rng = np.random.default_rng(7)
    for _ in range(200):
        ids = np.concatenate([[CLS], rng.integers(5, V, 20), [SEP], rng.integers(5, V, 20), [SEP]])
        m = masked(ids, rng, strategy="span", mask_prob=0.4)
        for start, end in m.spans:
            assert not IS_SPECIAL[ids[start:end]].any()


def test_bad_arguments():
    rng = np.random.default_rng(0)
    ids = sequence(rng, 10, 0)
    with pytest.raises(LmforgeError, match="not one of"):
        masked(ids, rng, strategy="bogus")
    with pytest.raises(LmforgeError, match="same 1-D shape"):
        mask_tokens(ids, special_mask=IS_SPECIAL[ids][:-1], vocab_size=V, non_special_ids=NON_SPECIAL,
                    mask_id=MASK, rng=rng)
    with pytest.raises(LmforgeError, match=r"in \[0, 99\)"):
        mask_tokens(np.array([2, 120, 3]), special_mask=np.array([True, False, True]), vocab_size=V,
                    non_special_ids=NON_SPECIAL, mask_id=MASK, rng=rng)
