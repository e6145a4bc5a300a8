"""Plan "stream" (``lmforge.data.lm_stream``): consecutive BPTT windows of a contiguous stream for the AWD-LSTM."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.config import DataConfig
from lmforge.data.lm_stream import LMStreamData, window_length
from lmforge.errors import LmforgeError


def stream_data(corpus, tokenizer, split="train", seq_len=8, variable=False, **kw) -> LMStreamData:
    config = DataConfig(objective="awd_lm", seq_len=seq_len, eval_fraction=0.1, variable_bptt=variable)
    return LMStreamData(corpus, config, tokenizer, split=split, **kw)


def test_windows_are_consecutive_and_labels_are_the_next_tokens(corpus, tokenizer):
    data = stream_data(corpus, tokenizer)
    rows = data.rows(3, epoch=0)
    it = data.batches(3)
    seen = []
    for k in range(4):
        batch = next(it)
        x, y = batch["input_ids"].numpy(), batch["labels"].numpy()
        assert x.shape == (3, 8)
        np.testing.assert_array_equal(x, rows[:, 8 * k:8 * k + 8])
        np.testing.assert_array_equal(y, rows[:, 8 * k + 1:8 * k + 9])  # each label is the next input
        assert batch["reset"].tolist() == [int(k == 0)] * 3  # the state restarts only at the stream's start
        seen.append(x)
    # the stream is the documents (each followed by [SEP]) cut into equal rows
    assert int((rows == tokenizer.sep_id).sum()) >= 1


def test_epochs_reshuffle_documents_and_restart_the_state(corpus, tokenizer):
    data = stream_data(corpus, tokenizer, seq_len=50)
    width = data.rows(2, 0).shape[1]
    n = len(range(0, width - 1, 50))
    it = data.batches(2)
    batches = [next(it) for _ in range(n + 1)]
    assert batches[n]["reset"].tolist() == [1, 1] and data.epoch == 1
    assert not np.array_equal(data.rows(2, 0), data.rows(2, 1))  # a new document order


def test_resume_continues_with_the_same_windows(corpus, tokenizer):
    data = stream_data(corpus, tokenizer, variable=True, seed=3)
    it = data.batches(2)
    first = [next(it) for _ in range(3)]
    state = data.state_dict()
    rest = [next(it)["input_ids"] for _ in range(3)]
    again = stream_data(corpus, tokenizer, variable=True, seed=3)
    again.load_state_dict(state)
    it2 = again.batches(2)
    for expected in rest:
        assert np.array_equal(next(it2)["input_ids"].numpy(), expected.numpy())
    assert len({b["input_ids"].shape[1] for b in first + [{"input_ids": r} for r in rest]}) > 1  # variable lengths


def test_variable_bptt_lengths():
    rng = np.random.default_rng(0)
    lengths = np.array([window_length(70, rng) for _ in range(4000)])
    assert lengths.min() >= 5 and lengths.max() <= 90
    assert 0.03 < float((lengths < 50).mean()) < 0.08  # about 5% of the windows are around bptt / 2
    assert abs(float(lengths[lengths >= 50].mean()) - 70) < 0.5


def test_eval_is_one_fixed_pass(corpus, tokenizer):
    data = stream_data(corpus, tokenizer, split="eval", variable=True)
    a = [b["input_ids"] for b in data.batches(2)]
    b = [b["input_ids"] for b in data.batches(2)]
    assert len(a) == len(b) >= 1 and all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b, strict=True))
    assert all(x.shape[1] == 8 for x in a[:-1])


def test_a_corpus_too_small_for_the_bptt_length_is_a_clear_error(corpus, tokenizer):
    data = stream_data(corpus, tokenizer, seq_len=4000)
    with pytest.raises(LmforgeError, match=r"fewer than one BPTT window of data.seq_len=4000 \+ 1; add text, or "
                                           r"lower --seq-len or --micro-batch-size"):
        next(data.batches(4))


def test_bidirectional_windows_give_the_backward_lm_its_own_stream_from_the_end(corpus, tokenizer):
    # the biLM: the forward window as usual, and the backward window of the same position counted from the rows'
    # ends (what reverse=True gives), in text order with the previous tokens as labels
    data = stream_data(corpus, tokenizer)
    data.bidirectional = True
    backward = stream_data(corpus, tokenizer, reverse=True)
    rows = data.rows(3, epoch=0)
    W = rows.shape[1]
    for k, (batch, reference) in enumerate(zip(data.batches(3), backward.batches(3), strict=False)):  # endless
        if k == 3:
            break
        np.testing.assert_array_equal(batch["input_ids"].numpy(), rows[:, 8 * k:8 * k + 8])
        bx, by = batch["backward_input_ids"].numpy(), batch["backward_labels"].numpy()
        np.testing.assert_array_equal(bx, rows[:, W - 8 * (k + 1):W - 8 * k])  # right to left through the rows
        np.testing.assert_array_equal(by, rows[:, W - 8 * (k + 1) - 1:W - 8 * k - 1])  # the previous tokens
        np.testing.assert_array_equal(bx, reference["input_ids"].numpy())
        np.testing.assert_array_equal(by, reference["labels"].numpy())
        assert "backward" not in batch and batch["reset"].tolist() == [int(k == 0)] * 3
