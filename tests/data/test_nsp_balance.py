"""NSP label balance: ``exact`` (default) is 50/50 by construction, ``bert`` keeps google-research/bert's draw (a
one-sentence chunk always gets a random second segment, about 56/44)."""

from bisect import bisect_left
from collections.abc import Callable

import numpy as np
import pytest

from lmforge.config import DataConfig
from lmforge.data.instances import NspSpec, _truncate_pair, plan_nsp_document
from lmforge.data.shards import ShardedCorpus, prepare_corpus

from .conftest import synthetic_documents, write_lines_file
from .test_pretraining import data_for


def old_plan_nsp_document(doc: int, offsets: np.ndarray, rng: np.random.Generator, *, seq_len: int,
                          short_seq_prob: float, nsp_prob: float, pool: np.ndarray,
                          offsets_of: Callable[[int], np.ndarray]) -> list[NspSpec]:
    """The plan before nsp_balance existed (a verbatim copy), to check that balance="bert" reproduces it."""
    max_tokens = seq_len - 3
    target = max_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    offs = offsets.tolist()  # Python ints: this loop runs once per sentence of the corpus every epoch
    n = len(offs) - 1
    specs: list[NspSpec] = []
    chunk_start = 0
    i = 0
    while i < n:
        if i == n - 1 or offs[i + 1] - offs[chunk_start] >= target:
            k = i - chunk_start + 1  # sentences in the chunk
            a_end = int(rng.integers(1, k)) if k >= 2 else 1
            a0, a1 = offs[chunk_start], offs[chunk_start + a_end]
            if k == 1 or rng.random() < nsp_prob:
                label = 1
                other = doc
                while other == doc:
                    other = int(pool[rng.integers(len(pool))])
                other_offs = offsets_of(other).tolist()
                first = int(rng.integers(len(other_offs) - 1))
                # take sentences from `first` until B reaches the rest of the target (at least one sentence)
                need = max(target - (a1 - a0), 1)
                last = bisect_left(other_offs, other_offs[first] + need)
                last = min(max(last, first + 1), len(other_offs) - 1)
                b_doc, b0, b1 = other, other_offs[first], other_offs[last]
                i -= k - a_end  # put the unused sentences back
            else:
                label = 0
                b_doc, b0, b1 = doc, a1, offs[i + 1]
            fa, ba, fb, bb = _truncate_pair(a1 - a0, b1 - b0, max_tokens, rng)
            specs.append(NspSpec(doc, a0 + fa, a1 - ba, b_doc, b0 + fb, b1 - bb, label))
            chunk_start = i + 1
        i += 1
    return specs


@pytest.fixture(scope="module")
def nsp_corpus(tmp_path_factory, tokenizer_dir) -> ShardedCorpus:
    """60 documents of 1-8 sentences (a sixth of them one sentence long)."""
    root = tmp_path_factory.mktemp("nsp-corpus")
    write_lines_file(root / "text" / "docs.txt", synthetic_documents(60, seed=21, sentences=(1, 9)))
    prepare_corpus(tokenizer_dir, [root / "text"], root / "prepared", workers=1, show_progress=False)
    return ShardedCorpus(root / "prepared", tokenizer_dir)


def plan_all(corpus, balance: str | None, seeds: range, seq_len: int, short_seq_prob: float = 0.1):
    pool = np.arange(corpus.num_documents)
    specs = []
    for seed in seeds:
        for doc in range(corpus.num_documents):
            rng = np.random.default_rng([seed, doc])
            options = dict(seq_len=seq_len, short_seq_prob=short_seq_prob, nsp_prob=0.5, pool=pool,
                           offsets_of=corpus.sentence_offsets)
            if balance is None:
                specs.extend(old_plan_nsp_document(doc, corpus.sentence_offsets(doc), rng, **options))
            else:
                specs.extend(plan_nsp_document(doc, corpus.sentence_offsets(doc), rng, balance=balance, **options))
    return specs


@pytest.mark.parametrize("seq_len", [32, 64, 128])
def test_exact_mode_is_balanced_and_next_is_real(nsp_corpus, seq_len):
    specs = plan_all(nsp_corpus, "exact", range(40), seq_len)
    labels = np.array([s.label for s in specs])
    assert len(labels) > 4000
    assert abs(labels.mean() - 0.5) < 0.02, labels.mean()
    for s in specs:
        assert 0 <= s.a_start < s.a_end and s.b_start < s.b_end
        assert (s.a_end - s.a_start) + (s.b_end - s.b_start) <= seq_len - 3
        if s.label == 0:  # B is text that follows A in A's own document
            assert s.b_doc == s.a_doc and s.b_start >= s.a_end
        else:
            assert s.b_doc != s.a_doc


@pytest.mark.parametrize("seq_len", [32, 128])
def test_bert_mode_reproduces_the_old_plan_and_its_56_44(nsp_corpus, seq_len):
    old = plan_all(nsp_corpus, None, range(10), seq_len)
    new = plan_all(nsp_corpus, "bert", range(10), seq_len)
    assert new == old
    share = np.mean([s.label for s in plan_all(nsp_corpus, "bert", range(40), seq_len)])
    assert share > 0.53  # one-sentence chunks are always random: the deviation "exact" removes


def test_one_sentence_documents_in_exact_mode():
    offsets = {0: np.array([0, 9]), 1: np.array([0, 5, 12]), 2: np.array([0, 1])}
    pool = np.array([0, 1, 2])
    labels, next_pairs = [], []
    for seed in range(4000):
        rng = np.random.default_rng(seed)
        for s in plan_nsp_document(0, offsets[0], rng, seq_len=64, short_seq_prob=0.0, nsp_prob=0.5, pool=pool,
                                   offsets_of=offsets.__getitem__, balance="exact"):
            labels.append(s.label)
            if s.label == 0:  # the one sentence is cut into A and the B that follows it
                assert s.a_doc == s.b_doc == 0 and s.a_start == 0 and s.a_end == s.b_start and s.b_end == 9
                next_pairs.append(s.a_end)
    assert len(labels) == 4000 and abs(np.mean(labels) - 0.5) < 0.02
    assert set(next_pairs) == set(range(1, 9))  # the cut is uniform over the token boundaries
    # a document of one one-token sentence has no continuation: no pair at all (of either label)
    assert plan_nsp_document(2, offsets[2], np.random.default_rng(0), seq_len=64, short_seq_prob=0.0, nsp_prob=0.5,
                             pool=pool, offsets_of=offsets.__getitem__, balance="exact") == []
    with pytest.raises(ValueError, match="balance"):
        plan_nsp_document(0, offsets[0], np.random.default_rng(0), seq_len=64, short_seq_prob=0.0, nsp_prob=0.5,
                          pool=pool, offsets_of=offsets.__getitem__, balance="even")


@pytest.mark.parametrize(("balance", "low", "high"), [("exact", 0.48, 0.52), ("bert", 0.53, 0.7)])
def test_pretraining_data_passes_the_setting(nsp_corpus, tokenizer, balance, low, high):
    cfg = DataConfig(seq_len=48, objective="mlm+nsp", nsp_balance=balance, eval_fraction=0.1)
    data = data_for(nsp_corpus, cfg, tokenizer, seed=0)
    labels = []
    for epoch in range(30):
        labels.extend(spec.label for spec in data._nsp_plan(epoch))
    assert len(labels) > 4000
    assert low < np.mean(labels) < high, np.mean(labels)
