"""Instance creation: BERT segment pairs with NSP, RoBERTa packing, SpanBERT segments, GPT causal blocks."""

import numpy as np
import pytest

from lmforge.data.instances import (
    _truncate_pair,
    make_causal_blocks,
    make_nsp_instances,
    make_packed_instances,
    make_segment_instances,
    plan_nsp_document,
    plan_packed,
    plan_segments,
)
from lmforge.errors import LmforgeError


def ids_of(corpus):
    s = corpus.special_ids
    return s["cls"], s["sep"]


def contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    n = len(needle)
    return any(np.array_equal(haystack[i:i + n], needle) for i in range(len(haystack) - n + 1))


def reference_truncation(la, lb, max_tokens):
    """BERT's loop, counting removals per segment (front/back does not change the counts)."""
    ra = rb = 0
    while la + lb > max_tokens:
        if la > lb:
            la, ra = la - 1, ra + 1
        else:
            lb, rb = lb - 1, rb + 1
    return ra, rb


@pytest.mark.parametrize("la, lb, max_tokens", [(10, 3, 8), (6, 6, 9), (3, 10, 8), (7, 6, 5), (4, 4, 8),
                                                 (30, 2, 5), (5, 9, 6)])
def test_truncation_counts_match_berts_loop(la, lb, max_tokens):
    rng = np.random.default_rng(0)
    fa, ba, fb, bb = _truncate_pair(la, lb, max_tokens, rng)
    assert (fa + ba, fb + bb) == reference_truncation(la, lb, max_tokens)
    assert min(fa, ba, fb, bb) >= 0


def test_truncation_takes_front_and_back_about_equally():
    rng = np.random.default_rng(1)
    fronts = [_truncate_pair(50, 0, 10, rng)[0] for _ in range(400)]
    assert abs(np.mean(fronts) - 20) < 1.0


def test_nsp_pairs(corpus):
    cls_id, sep_id = ids_of(corpus)
    labels = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        for doc in range(corpus.num_documents):
            doc_tokens = corpus.document_tokens(doc)
            for inst in make_nsp_instances(corpus, doc, rng, seq_len=64, cls_id=cls_id, sep_id=sep_id):
                ids, types = inst.input_ids, inst.token_type_ids
                assert len(ids) <= 64 and ids[0] == cls_id and ids[-1] == sep_id
                seps = np.flatnonzero(ids == sep_id)
                assert len(seps) == 2
                a, b = ids[1:seps[0]], ids[seps[0] + 1:-1]
                assert len(a) >= 1 and len(b) >= 1
                assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
                assert contains(doc_tokens, a)
                if inst.nsp_label == 0:
                    assert contains(doc_tokens, np.concatenate([a, b])) or contains(doc_tokens, b)
                labels.append(inst.nsp_label)
    # nsp_prob = 0.5 and balance "exact" (the default): one-sentence chunks are no longer forced random, so the
    # share is 0.5 in expectation (0.46 here from 420 draws; the tight check is in test_nsp_balance.py)
    assert abs(np.mean(labels) - 0.5) < 0.06 and len(labels) > 300


def test_random_next_comes_from_another_document_and_real_next_follows(corpus):
    pool = np.arange(corpus.num_documents)
    for seed in range(5):
        rng = np.random.default_rng(seed)
        for doc in range(corpus.num_documents):
            specs = plan_nsp_document(doc, corpus.sentence_offsets(doc), rng, seq_len=48, short_seq_prob=0.1,
                                      nsp_prob=0.5, pool=pool, offsets_of=corpus.sentence_offsets)
            for s in specs:
                assert s.a_doc == doc and 0 <= s.a_start < s.a_end
                assert (s.a_end - s.a_start) + (s.b_end - s.b_start) <= 48 - 3
                if s.label == 1:
                    assert s.b_doc != doc
                else:
                    assert s.b_doc == doc and s.b_start >= s.a_end


def test_short_sequences_and_truncation(corpus):
    cls_id, sep_id = ids_of(corpus)
    rng = np.random.default_rng(3)
    lengths = []
    for doc in range(corpus.num_documents):
        for inst in make_nsp_instances(corpus, doc, rng, seq_len=12, short_seq_prob=0.0, cls_id=cls_id,
                                       sep_id=sep_id):
            lengths.append(len(inst.input_ids))
    assert max(lengths) == 12  # sentences (~25 tokens) are longer: every pair is truncated to fit
    shorter = []
    for doc in range(corpus.num_documents):
        for inst in make_nsp_instances(corpus, doc, rng, seq_len=128, short_seq_prob=1.0, cls_id=cls_id,
                                       sep_id=sep_id):
            shorter.append(len(inst.input_ids))
    assert max(shorter) <= 128


def test_nsp_needs_two_documents(corpus):
    cls_id, sep_id = ids_of(corpus)
    with pytest.raises(LmforgeError, match="NSP needs at least two documents.*objective \"mlm\""):
        make_nsp_instances(corpus, 0, np.random.default_rng(0), seq_len=64, cls_id=cls_id, sep_id=sep_id,
                           documents=[0])


def test_packed_full_sentences(corpus):
    cls_id, sep_id = ids_of(corpus)
    instances = make_packed_instances(corpus, seq_len=100, cls_id=cls_id, sep_id=sep_id)
    stream = []
    for inst in instances:
        ids = inst.input_ids
        assert len(ids) <= 100 and ids[0] == cls_id and ids[-1] == sep_id and not inst.token_type_ids.any()
        assert inst.nsp_label == -1
        pieces = np.split(ids[1:], np.flatnonzero(ids[1:] == sep_id) + 1)
        for piece in pieces[:-1]:
            stream.append(piece[:-1])  # one piece per document, [SEP] after each
    # the pieces, in order, are the documents: every token exactly once, documents split only between instances
    np.testing.assert_array_equal(np.concatenate(stream),
                                  np.concatenate([corpus.document_tokens(d) for d in range(corpus.num_documents)]))
    assert len(instances) < corpus.num_tokens / 60  # well filled


@pytest.mark.parametrize("plan", [plan_packed, plan_segments])
def test_pieces_start_and_end_at_sentence_boundaries(corpus, plan):
    pieces = [p for inst in plan(range(corpus.num_documents), corpus.sentence_offsets, 100) for p in inst]
    for doc, start, end in pieces:
        offsets = corpus.sentence_offsets(doc).tolist()
        assert start in offsets and end in offsets and start < end


def test_segments_stay_inside_one_document(corpus):
    cls_id, sep_id = ids_of(corpus)
    instances = make_segment_instances(corpus, seq_len=70, cls_id=cls_id, sep_id=sep_id)
    rebuilt = []
    for inst in instances:
        ids = inst.input_ids
        assert len(ids) <= 70 and ids[0] == cls_id and ids[-1] == sep_id and (ids == sep_id).sum() == 1
        rebuilt.append(ids[1:-1])
    np.testing.assert_array_equal(np.concatenate(rebuilt),
                                  np.concatenate([corpus.document_tokens(d) for d in range(corpus.num_documents)]))
    # a document boundary always starts a new segment
    starts = {0}
    for d in range(corpus.num_documents - 1):
        starts.add(int(sum(len(corpus.document_tokens(k)) for k in range(d + 1))))
    boundaries = set(np.cumsum([0] + [len(r) for r in rebuilt]).tolist())
    assert starts <= boundaries


def test_long_sentences_are_cut_not_lost(corpus):
    cls_id, sep_id = ids_of(corpus)
    for make in (make_packed_instances, make_segment_instances):
        instances = make(corpus, seq_len=10, cls_id=cls_id, sep_id=sep_id)
        assert max(len(i.input_ids) for i in instances) <= 10
        text = np.concatenate([i.input_ids[(i.input_ids != cls_id) & (i.input_ids != sep_id)] for i in instances])
        assert len(text) == corpus.num_tokens


def test_causal_blocks(corpus):
    sep_id = corpus.special_ids["sep"]
    blocks = make_causal_blocks(corpus, 37)
    stream = np.concatenate([np.append(corpus.document_tokens(d), sep_id) for d in range(corpus.num_documents)])
    assert len(blocks) == (len(stream) - 1) // 37
    for i in range(len(blocks)):
        np.testing.assert_array_equal(blocks[i], stream[i * 37:i * 37 + 38])
    with pytest.raises(IndexError):
        blocks[len(blocks)]
    other = make_causal_blocks(corpus, 5, eos_id=99, documents=[3, 1])
    stream = np.concatenate([np.append(corpus.document_tokens(d), 99) for d in (3, 1)])
    np.testing.assert_array_equal(np.concatenate([other[i][:-1] for i in range(len(other))]),
                                  stream[:len(other) * 5])
