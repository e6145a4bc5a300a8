"""ALBERT's sentence-order prediction pairs: consecutive segments of one document, swapped with probability 0.5."""

import numpy as np
import pytest
import torch

from lmforge.config import DataConfig
from lmforge.data.instances import plan_sop_document
from lmforge.data.shards import ShardedCorpus, prepare_corpus

from .conftest import synthetic_documents, write_lines_file
from .test_pretraining import data_for, take


@pytest.fixture(scope="module")
def sop_corpus(tmp_path_factory, tokenizer_dir) -> ShardedCorpus:
    """60 documents of 1-8 sentences (a sixth of them one sentence long)."""
    root = tmp_path_factory.mktemp("sop-corpus")
    write_lines_file(root / "text" / "docs.txt", synthetic_documents(60, seed=22, sentences=(1, 9)))
    prepare_corpus(tokenizer_dir, [root / "text"], root / "prepared", workers=1, show_progress=False)
    return ShardedCorpus(root / "prepared", tokenizer_dir)


def plan_all(corpus, seeds: range, seq_len: int, sop_prob: float = 0.5):
    specs = []
    for seed in seeds:
        for doc in range(corpus.num_documents):
            rng = np.random.default_rng([seed, doc])
            specs.extend(plan_sop_document(doc, corpus.sentence_offsets(doc), rng, seq_len=seq_len,
                                           short_seq_prob=0.1, sop_prob=sop_prob))
    return specs


@pytest.mark.parametrize("seq_len", [32, 128])
def test_sop_pairs_are_balanced_and_consecutive(sop_corpus, seq_len):
    specs = plan_all(sop_corpus, range(40), seq_len)
    labels = np.array([s.label for s in specs])
    assert len(labels) > 3000
    assert abs(labels.mean() - 0.5) < 0.025, labels.mean()
    for s in specs:
        assert s.a_doc == s.b_doc  # never another document's text (no NSP negatives inside SOP)
        assert s.a_start < s.a_end and s.b_start < s.b_end
        assert (s.a_end - s.a_start) + (s.b_end - s.b_start) <= seq_len - 3
        offsets = sop_corpus.sentence_offsets(s.a_doc)
        if s.label == 0:  # in order: B follows A; only truncation may leave a gap, never sentences
            first, second = (s.a_start, s.a_end), (s.b_start, s.b_end)
        else:  # swapped: the first segment is the text that came second
            first, second = (s.b_start, s.b_end), (s.a_start, s.a_end)
        assert first[1] <= second[0]
        # nothing but truncated tokens of the two segments' own sentences lies between them: no whole sentence
        between = [o for o in offsets.tolist() if first[1] < o < second[0]]
        assert len(between) <= 1, (s, offsets)


def test_sop_prob_is_the_swap_rate(sop_corpus):
    for p in (0.0, 1.0):
        labels = {s.label for s in plan_all(sop_corpus, range(3), 64, sop_prob=p)}
        assert labels == {int(p)}


def test_swapped_pair_holds_the_same_tokens_as_its_unswapped_twin(sop_corpus):
    # The swap draw comes after the chunking draws, so p = 0 and p = 1 see the same pairs in the other order.
    kept = plan_all(sop_corpus, range(2), 64, sop_prob=0.0)
    swapped = plan_all(sop_corpus, range(2), 64, sop_prob=1.0)
    assert len(kept) == len(swapped)
    for k, s in zip(kept, swapped, strict=True):
        assert (s.a_doc, s.a_start, s.a_end, s.b_doc, s.b_start, s.b_end) == \
            (k.b_doc, k.b_start, k.b_end, k.a_doc, k.a_start, k.a_end)


def test_sop_batches_carry_labels_and_segment_types(sop_corpus, tokenizer):
    cfg = DataConfig(objective="mlm+sop", seq_len=48, eval_fraction=0.1, max_predictions=8)
    data = data_for(sop_corpus, cfg, tokenizer, seed=3)
    labels = []
    for batch in take(data, 16, 6):
        assert set(batch) >= {"input_ids", "token_type_ids", "mlm_labels", "nsp_labels"}
        labels += batch["nsp_labels"].tolist()
        # [CLS] first [SEP] second [SEP]: segment 1 starts after the first [SEP]
        for ids, types, mask in zip(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                    strict=True):
            n = int(mask.sum())
            sep = (ids[:n] == tokenizer.sep_id).nonzero().flatten().tolist()
            assert sep[-1] == n - 1
            assert torch.equal(types[:n], (torch.arange(n) > sep[0]).long())
    assert set(labels) == {0, 1}


def test_one_document_is_enough_for_sop(tmp_path, tokenizer_dir, tokenizer):
    write_lines_file(tmp_path / "text" / "doc.txt", synthetic_documents(1, seed=5, sentences=(8, 9)))
    prepare_corpus(tokenizer_dir, [tmp_path / "text"], tmp_path / "prepared", workers=1, show_progress=False)
    corpus = ShardedCorpus(tmp_path / "prepared", tokenizer_dir)
    assert corpus.num_documents == 1
    cfg = DataConfig(objective="mlm+sop", seq_len=24, eval_fraction=0.0, max_predictions=4)
    data = data_for(corpus, cfg, tokenizer, seed=0)  # NSP would refuse a single document
    assert data.examples_per_epoch() >= 2
