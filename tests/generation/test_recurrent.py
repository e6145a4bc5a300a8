"""The recurrent adapter (``encode`` / ``decode_step`` / ``reorder_state``) on a fake model that follows the contract
and on the real ``RNNSeq2Seq``: beam 1 == greedy, padded batches == one source at a time, scores == teacher-forced
log-probabilities, beams in score order."""

from __future__ import annotations

import pytest
import torch

from lmforge.generation import RecurrentAdapter, adapter_for, generate
from tests.generation.helpers import BOS, EOS, FakeRNNSeq2Seq, V, padded_batch, unpadded

LENGTHS = [6, 2, 4]


def _real_rnn(seed: int = 0, **overrides):
    from lmforge.config import model_config_from_preset
    from lmforge.models.rnn_seq2seq import RNNSeq2Seq

    values = dict(vocab_size=V, d_model=12, n_layers=2, dropout=0.0, max_seq_len=24)
    values.update(overrides)
    torch.manual_seed(seed)
    model = RNNSeq2Seq(model_config_from_preset("rnn-seq2seq", **values)).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # larger weights: peaked distributions, no near-ties
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


MODELS = {
    "fake": FakeRNNSeq2Seq,
    "rnn-gru-general": lambda: _real_rnn(0),
    "rnn-lstm-additive": lambda: _real_rnn(1, rnn_cell="lstm", attention="additive"),
    "rnn-local-m": lambda: _real_rnn(2, attention_window=1),
    "rnn-none": lambda: _real_rnn(3, attention="none"),
    "rnn-local-p-bahdanau": lambda: _real_rnn(4, attention_window=2, attention_alignment="predictive",
                                              decoder_order="bahdanau"),
    "rnn-hard-reinforce": lambda: _real_rnn(5, hard_attention=True, hard_attention_estimator="reinforce"),
}


@pytest.fixture(params=list(MODELS))
def model(request):
    return MODELS[request.param]()


def test_the_adapter_is_recurrent(model):
    assert isinstance(adapter_for(model, bos_id=BOS), RecurrentAdapter)


def test_beam_of_one_equals_greedy(model):
    ids, mask = padded_batch(20, LENGTHS, side="right")
    options = dict(max_new_tokens=9, eos_id=EOS, bos_id=BOS)
    greedy = generate(model, ids, mask, **options)
    beam = generate(model, ids, mask, strategy="beam", num_beams=1, **options)
    assert greedy.sequences == beam.sequences and greedy.stop_tokens == beam.stop_tokens


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_one_source_at_a_time(model, side):
    ids, mask = padded_batch(21, LENGTHS, side=side)
    options = dict(max_new_tokens=8, eos_id=EOS, bos_id=BOS, strategy="beam", num_beams=3, num_return_sequences=2)
    batch = generate(model, ids, mask, **options)
    for row in range(len(LENGTHS)):
        alone = generate(model, unpadded(ids, mask, row), **options)
        assert batch.sequences[row] == alone.sequences[0]
        assert batch.scores[row] == pytest.approx(alone.scores[0], abs=1e-9)


def _teacher_forced(model, src: torch.Tensor, new: list[int], stop: int | None) -> float:
    tokens = new + ([] if stop is None else [stop])
    state = model.encode(src)
    prev = torch.tensor([BOS])
    total = 0.0
    with torch.no_grad():
        for token in tokens:
            logits, state = model.decode_step(prev, state)
            total += float(logits.log_softmax(-1)[0, token])
            prev = torch.tensor([token])
    return total


def test_beams_are_sorted_and_scored_with_the_model_log_probabilities(model):
    ids, mask = padded_batch(22, LENGTHS, side="right")
    out = generate(model, ids, mask, strategy="beam", num_beams=4, num_return_sequences=3, max_new_tokens=6,
                   eos_id=EOS, bos_id=BOS, length_penalty="average")
    for row in range(len(LENGTHS)):
        assert out.scores[row] == sorted(out.scores[row], reverse=True)
        for seq, log_prob, stop in zip(out.sequences[row], out.log_probs[row], out.stop_tokens[row], strict=True):
            assert log_prob == pytest.approx(_teacher_forced(model, unpadded(ids, mask, row), seq, stop), abs=1e-9)


def test_real_rnn_teacher_forcing_agrees_with_greedy_steps():
    model = _real_rnn(3)
    ids, mask = padded_batch(23, LENGTHS, side="right")
    out = generate(model, ids, mask, max_new_tokens=7, bos_id=BOS)  # no EOS: 7 tokens each
    tgt = torch.cat((torch.full((3, 1), BOS), torch.tensor([s[0] for s in out.sequences])), dim=1)
    with torch.no_grad():
        logits = model(ids, tgt[:, :-1], mask).logits  # (B, 7, V)
    assert logits.argmax(-1).tolist() == [s[0] for s in out.sequences]
