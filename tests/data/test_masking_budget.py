"""The masked-LM prediction budget follows the length: realised rate and 80/10/10 at 128 and 512 tokens for token,
whole-word and span masking, and the warning when a set ``max_predictions`` caps the rate below ``mask_prob``."""

import itertools
import logging

import numpy as np
import pytest

from lmforge.config import DataConfig
from lmforge.data import pretraining
from lmforge.data.shards import ShardedCorpus, prepare_corpus

from .conftest import synthetic_documents, write_lines_file
from .test_pretraining import data_for

CASES = [("mlm", "token"), ("mlm", "whole_word"), ("span", "span")]


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory, tokenizer_dir) -> ShardedCorpus:
    """40 documents of 30-60 sentences (about 900 tokens each), so that 512-token segments fill up."""
    root = tmp_path_factory.mktemp("long-corpus")
    write_lines_file(root / "text" / "docs.txt", synthetic_documents(40, seed=11, sentences=(30, 60)))
    prepare_corpus(tokenizer_dir, [root / "text"], root / "prepared", workers=1, show_progress=False)
    return ShardedCorpus(root / "prepared", tokenizer_dir)


@pytest.mark.parametrize("seq_len", [128, 512])
@pytest.mark.parametrize(("objective", "masking"), CASES)
def test_realised_rate_is_15_percent_and_the_split_80_10_10(long_corpus, tokenizer, seq_len, objective, masking):
    cfg = DataConfig(seq_len=seq_len, objective=objective, masking=masking, eval_fraction=0.0)
    data = data_for(long_corpus, cfg, tokenizer, seed=1)
    assert data.max_predictions == round(0.15 * seq_len)  # 19 at 128, 77 at 512 (was a fixed 20)
    special = np.zeros(tokenizer.vocab_size, dtype=bool)
    special[sorted(tokenizer.special_ids)] = True
    n_sequences = 3000 * 128 // seq_len  # about 380k tokens either way, over several epochs of new masks
    candidates = predicted = masked = unchanged = 0
    per_sequence = []
    for batch in itertools.islice(data.batches(8), n_sequences // 8):
        ids, labels = batch["input_ids"].numpy(), batch["mlm_labels"].numpy()
        real = batch["attention_mask"].numpy().astype(bool)
        chosen = labels != -100
        original = np.where(chosen, labels, ids)  # the uncorrupted sequence
        is_candidate = real & ~special[original]
        if masking == "span":  # a span needs an unmasked boundary token: the first and last position are never in one
            is_candidate[:, 0] = False
            is_candidate[np.arange(len(ids)), real.sum(1) - 1] = False
        candidates += int(is_candidate.sum())
        predicted += int(chosen.sum())
        masked += int((ids[chosen] == tokenizer.mask_id).sum())
        unchanged += int((ids[chosen] == labels[chosen]).sum())
        per_sequence.extend(chosen.sum(1).tolist())
    rate = predicted / candidates
    tolerance = 0.005 if masking == "token" else 0.01  # whole words / spans may stop short of the budget
    assert abs(rate - 0.15) < tolerance, rate
    if seq_len == 512:
        assert max(per_sequence) > 20  # the old fixed cap is gone
    # 80/10/10: per token for token and whole-word masking, per span (all its tokens alike) for span masking
    spread = 0.015 if masking != "span" else 0.03
    assert abs(masked / predicted - 0.8) < spread
    assert abs(unchanged / predicted - 0.1) < spread  # (a random replacement equal to the original is rare)
    assert abs((predicted - masked - unchanged) / predicted - 0.1) < spread


@pytest.mark.parametrize(("objective", "masking"), CASES)
def test_a_cap_below_the_requested_rate_warns_once(long_corpus, tokenizer, monkeypatch, caplog, objective, masking):
    monkeypatch.setattr(pretraining, "_warned_caps", set())
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        data_for(long_corpus, DataConfig(seq_len=512, objective=objective, masking=masking), tokenizer)
        data_for(long_corpus, DataConfig(seq_len=128, objective=objective, masking=masking, max_predictions=19),
                 tokenizer)
    assert not caplog.records  # the default follows the length; a cap at the budget lowers nothing
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        for split in ("train", "eval", "train"):
            data = data_for(long_corpus, DataConfig(seq_len=512, objective=objective, masking=masking,
                                                    max_predictions=20), tokenizer, split=split)
    assert data.max_predictions == 20
    assert len(caplog.records) == 1  # once per run, not per data object
    message = caplog.records[0].getMessage()
    assert "max_predictions=20" in message and "3.9%" in message
    batch = next(data.batches(4))
    assert ((batch["mlm_labels"] != -100).sum(1) <= 20).all()  # the cap is still honoured


def test_causal_data_never_warns(long_corpus, tokenizer, monkeypatch, caplog):
    monkeypatch.setattr(pretraining, "_warned_caps", set())
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        data_for(long_corpus, DataConfig(seq_len=128, objective="clm", max_predictions=1), tokenizer)
    assert not caplog.records
