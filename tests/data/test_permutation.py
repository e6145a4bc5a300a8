"""XLNet permutation-LM data: masks against an independent loop over the order, span statistics, target rows."""

import numpy as np
import pytest

from lmforge.data.permutation import (
    default_num_predict,
    factorization_order,
    permutation_masks,
    plm_example,
    plm_span_length_pmf,
    sample_prediction_spans,
    sample_prediction_targets,
    target_arrays,
)
from lmforge.errors import LmforgeError

V = 50
SPECIAL = np.array([0, 1, 2])  # [PAD] [CLS] [SEP]
PAD, CLS, SEP = SPECIAL
IS_SPECIAL = np.isin(np.arange(V), SPECIAL)


def sequence(rng, n_text: int, n_pad: int = 0, sep_every: int = 0) -> np.ndarray:
    """[CLS] text [SEP] [PAD]...; with ``sep_every``, a [SEP] inside the text every so many tokens."""
    text = rng.integers(3, V, size=n_text)
    if sep_every:
        text[sep_every::sep_every] = SEP
    return np.concatenate([[CLS], text, [SEP], np.full(n_pad, PAD)]).astype(np.int64)


def example(ids, rng, **options):
    return plm_example(ids, rng=rng, special_mask=IS_SPECIAL[ids], **options)


def reference_masks(order, targets):
    """Content and query masks (True = cannot see) by walking the order: the non-targets (the first ranks) see
    one another; each target sees the context, the targets before it and (content stream only) itself."""
    seq_len = len(order)
    content = np.ones((seq_len, seq_len), dtype=bool)
    n_context = int((~targets).sum())
    context = [int(p) for p in order[:n_context]]
    for p in context:
        for q in context:
            content[p, q] = False
    seen = list(context)
    for p in order[n_context:]:
        for q in seen:
            content[p, q] = False
        content[p, p] = False
        seen.append(int(p))
    query = content.copy()
    for p in range(seq_len):
        query[p, p] = True
    return content, query


def runs(mask):
    """[start, end) of the maximal runs of True."""
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return edges.reshape(-1, 2)


def test_masks_match_an_independent_loop_over_the_order():
    rng = np.random.default_rng(0)
    for trial in range(60):
        ids = sequence(rng, int(rng.integers(5, 40)), n_pad=int(rng.integers(0, 4)), sep_every=7)
        ex = example(ids, rng, partial_k=[1, 2, 6][trial % 3], max_span=int(rng.integers(1, 6)))
        content, query = reference_masks(ex["order"], ex["is_target"])
        np.testing.assert_array_equal(ex["perm_mask"], content)
        np.testing.assert_array_equal(ex["query_perm_mask"], query)
        np.testing.assert_array_equal(ex["query_perm_mask"], ex["perm_mask"] | np.eye(len(ids), dtype=bool))
        # a target sees exactly the tokens earlier in the order (and itself in the content stream)
        rank = np.argsort(ex["order"])
        for i in np.flatnonzero(ex["is_target"]):
            np.testing.assert_array_equal(~ex["query_perm_mask"][i], rank < rank[i])


def test_non_targets_come_first_and_targets_are_never_special():
    rng = np.random.default_rng(1)
    for _ in range(200):
        ids = sequence(rng, 60, n_pad=10, sep_every=9)
        ex = example(ids, rng, partial_k=3)
        order, targets = ex["order"], ex["is_target"]
        np.testing.assert_array_equal(np.sort(order), np.arange(len(ids)))
        n_context = int((~targets).sum())
        assert not targets[order[:n_context]].any() and targets[order[n_context:]].all()
        assert not (targets & IS_SPECIAL[ids]).any()
        assert 1 <= targets.sum() <= ex["target_mapping"].shape[0]


def test_targets_order_is_random_and_covers_all_orders():
    rng = np.random.default_rng(2)
    targets = np.array([False, True, True, False, True])
    seen = {tuple(factorization_order(5, rng=rng, targets=targets)) for _ in range(300)}
    assert len(seen) == 6  # 3! orders of the targets, context (positions 0, 3) always first
    assert all(o[:2] == (0, 3) for o in seen)
    identity = factorization_order(5, rng=rng, targets=targets, order="identity")
    np.testing.assert_array_equal(identity, [0, 3, 1, 2, 4])


@pytest.mark.parametrize("k", [6, 3])
def test_about_one_kth_of_the_tokens_are_predicted(k):
    rng = np.random.default_rng(3)
    n, draws = 600, 150
    ids = rng.integers(3, V, size=n)
    counts = [sample_prediction_targets(ids, rng=rng, special_mask=np.zeros(n, bool), num_predict=n,
                                        partial_k=k).sum() for _ in range(draws)]
    assert abs(np.mean(counts) / n - 1 / k) < 0.005
    assert np.std(counts) < 3  # one span of L targets per block of K L tokens: little spread


def test_num_predict_caps_the_targets():
    rng = np.random.default_rng(4)
    ids = sequence(rng, 120)
    cap = default_num_predict(len(ids), 6)
    assert cap == 21  # ceil(122 / 6)
    counts = []
    for _ in range(300):
        ex = example(ids, rng)
        assert ex["target_mapping"].shape == (cap, len(ids))
        counts.append(ex["is_target"].sum())
    assert max(counts) <= cap and max(counts) == cap  # it binds sometimes
    for _ in range(100):
        assert example(ids, rng, num_predict=3)["is_target"].sum() <= 3
    assert default_num_predict(512, 6) == 86


def test_span_lengths_follow_one_over_l_and_spans_are_contiguous_non_special_runs():
    rng = np.random.default_rng(5)
    max_span = 5
    lengths = []
    for _ in range(250):
        ids = sequence(rng, 300, sep_every=37)
        special = IS_SPECIAL[ids]
        spans = sample_prediction_spans(ids, rng=rng, special_mask=special, num_predict=len(ids), max_span=max_span)
        assert (spans[:, 0] < spans[:, 1]).all() and (spans[1:, 0] >= spans[:-1, 1]).all()  # sorted, disjoint
        assert (spans[:, 1] - spans[:, 0] <= max_span).all()
        for start, end in spans:
            assert not special[start:end].any()
            # count the spans that nothing could cut short: no special token or sequence end in reach (a test on
            # the start only, so it does not favour any length)
            if start + max_span <= len(ids) and not special[start:start + max_span].any():
                lengths.append(end - start)
    freq = np.bincount(lengths, minlength=max_span + 1)[1:] / len(lengths)
    np.testing.assert_allclose(freq, plm_span_length_pmf(max_span), atol=0.02)
    np.testing.assert_allclose(plm_span_length_pmf(5), np.array([60, 30, 20, 15, 12]) / 137)


def test_targets_mask_is_the_union_of_the_spans():
    ids = sequence(np.random.default_rng(6), 80, sep_every=11)
    for seed in range(20):
        spans = sample_prediction_spans(ids, rng=np.random.default_rng(seed), special_mask=IS_SPECIAL[ids],
                                        num_predict=20, partial_k=2)
        mask = sample_prediction_targets(ids, rng=np.random.default_rng(seed), special_mask=IS_SPECIAL[ids],
                                         num_predict=20, partial_k=2)
        expected = np.zeros(len(ids), bool)
        for start, end in spans:
            expected[start:end] = True
        np.testing.assert_array_equal(mask, expected)
        assert mask.sum() <= 20


def test_whole_word_spans():
    rng = np.random.default_rng(7)
    ids = sequence(rng, 200, sep_every=50)
    special = IS_SPECIAL[ids]
    word_starts = rng.random(len(ids)) < 0.5
    starts = word_starts.copy()
    starts[1:] |= special[:-1]
    for _ in range(200):
        spans = sample_prediction_spans(ids, rng=rng, special_mask=special, num_predict=len(ids) // 4,
                                        word_starts=word_starts, partial_k=3, max_span=3)
        for start, end in spans:
            assert starts[start] and not special[start:end].any()
            assert end == len(ids) or starts[end] or special[end]  # ends at a word boundary
            assert 1 + starts[start + 1:end].sum() <= 3  # at most max_span words
        assert sum(e - s for s, e in spans) <= len(ids) // 4


def test_identity_order_with_every_token_a_target_gives_the_causal_masks():
    rng = np.random.default_rng(8)
    n = 17
    ids = rng.integers(3, V, size=n)
    causal_content = np.triu(np.ones((n, n), dtype=bool), 1)  # cannot see the future
    causal_query = np.triu(np.ones((n, n), dtype=bool), 0)  # nor itself
    ex = plm_example(ids, rng=rng, special_mask=np.zeros(n, bool), partial_k=1, num_predict=n, order="identity")
    assert ex["is_target"].all()
    np.testing.assert_array_equal(ex["order"], np.arange(n))
    np.testing.assert_array_equal(ex["perm_mask"], causal_content)
    np.testing.assert_array_equal(ex["query_perm_mask"], causal_query)
    np.testing.assert_array_equal(ex["labels"], ids)
    np.testing.assert_array_equal(ex["target_mapping"], np.eye(n))
    order = factorization_order(n, rng=rng, targets=np.ones(n, bool), order="identity")
    content, query = permutation_masks(order, np.ones(n, bool))
    np.testing.assert_array_equal(content, causal_content)
    np.testing.assert_array_equal(query, causal_query)


def test_target_rows_are_one_hot_in_position_order_then_padding():
    rng = np.random.default_rng(9)
    for _ in range(50):
        ids = sequence(rng, 50, n_pad=5)
        ex = example(ids, rng, num_predict=20)
        positions = np.flatnonzero(ex["is_target"])
        n = len(positions)
        mapping = ex["target_mapping"]
        assert mapping.shape == (20, len(ids)) and mapping.dtype == np.float32
        np.testing.assert_array_equal(mapping[:n].argmax(1), positions)
        np.testing.assert_array_equal(mapping[:n].sum(1), 1.0)
        assert not mapping[n:].any()
        np.testing.assert_array_equal(ex["labels"][:n], ids[positions])
        assert (ex["labels"][n:] == -100).all()
        np.testing.assert_array_equal(ex["target_mask"], np.arange(20) < n)
        np.testing.assert_array_equal(ex["input_ids"], ids)
        np.testing.assert_array_equal(mapping @ np.arange(len(ids)), np.where(ex["target_mask"], mapping.argmax(1), 0))


def test_short_sequence_with_large_k_still_predicts_one_token():
    for seed in range(50):
        ids = np.array([CLS, 7, 8, SEP])
        ex = plm_example(ids, rng=np.random.default_rng(seed), special_mask=IS_SPECIAL[ids], partial_k=6)
        assert ex["target_mask"].shape == (1,) and ex["is_target"].sum() == 1
        assert ex["is_target"][1:3].any()


def test_same_seed_same_example_different_seeds_differ():
    ids = sequence(np.random.default_rng(10), 100, n_pad=8)
    a = example(ids, np.random.default_rng(123))
    b = example(ids, np.random.default_rng(123))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    c = example(ids, np.random.default_rng(124))
    assert not np.array_equal(a["order"], c["order"]) or not np.array_equal(a["is_target"], c["is_target"])


@pytest.mark.parametrize("options, message", [
    ({"partial_k": 0}, "partial_k"),
    ({"partial_k": 0.5}, "partial_k"),
    ({"max_span": 0}, "max_span"),
    ({"num_predict": 0}, "num_predict"),
    ({"num_predict": 13}, "num_predict=13 must be in 1..12"),
    ({"order": "reverse"}, "order"),
])
def test_bad_settings_raise(options, message):
    ids = sequence(np.random.default_rng(11), 10)
    with pytest.raises(LmforgeError, match=message):
        example(ids, np.random.default_rng(0), **options)


def test_bad_inputs_raise():
    rng = np.random.default_rng(12)
    ids = sequence(rng, 10)
    with pytest.raises(LmforgeError, match="no predictable token"):
        plm_example(np.array([CLS, SEP, PAD]), rng=rng, special_mask=np.ones(3, bool))
    with pytest.raises(LmforgeError, match="special_mask"):
        plm_example(ids, rng=rng, special_mask=np.zeros(3, bool))
    with pytest.raises(LmforgeError, match="word_starts"):
        plm_example(ids, rng=rng, special_mask=IS_SPECIAL[ids], word_starts=np.ones(2, bool))
    targets = np.array([True, False, True])
    with pytest.raises(LmforgeError, match="non-target before every target"):
        permutation_masks(np.array([0, 1, 2]), targets)
    with pytest.raises(LmforgeError, match="permutation"):
        permutation_masks(np.array([1, 1, 2]), targets)
    with pytest.raises(LmforgeError, match="targets must be"):
        factorization_order(3, rng=rng, targets=np.array([1, 0, 1]))
    with pytest.raises(LmforgeError, match="raise num_predict"):
        target_arrays(np.arange(3), targets, 1)
