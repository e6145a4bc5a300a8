"""Search properties on real (tiny, float64) models: cached == uncached, beam 1 == greedy, top-k 1 == greedy,
left-padded batches == one prompt at a time, scores are the model's log-probabilities, stop tokens, the
encoder-decoder and RNN adapters."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.generation import GenerationConfig, generate
from lmforge.generation.search import argmax_rows
from tests.generation.helpers import (
    BOS,
    EOS,
    FakeRNNSeq2Seq,
    decoder,
    encoder_decoder,
    padded_batch,
    random_ids,
    unpadded,
)

LENGTHS = [7, 3, 5]  # batch 3, padded to 7
STRATEGIES = {
    "greedy": dict(strategy="greedy"),
    "beam": dict(strategy="beam", num_beams=3, num_return_sequences=2, length_penalty="gnmt:0.6"),
    "sample": dict(strategy="sample", num_return_sequences=2, top_k=8, top_p=0.9, temperature=0.8, seed=5),
}


def _equal_outputs(a, b) -> None:
    assert a.sequences == b.sequences
    assert a.stop_tokens == b.stop_tokens
    for x, y in zip(a.log_probs, b.log_probs, strict=True):
        assert x == pytest.approx(y, abs=1e-9)


# -------------------------------------------------------------------------------------------- cache == no cache
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_decoder_cached_equals_uncached_on_a_padded_batch(strategy, positional):
    model = decoder(positional=positional)
    ids, mask = padded_batch(1, LENGTHS)
    options = dict(max_new_tokens=9, eos_id=EOS, repetition_penalty=1.3, **STRATEGIES[strategy])
    cached = generate(model, ids, mask, **options)
    uncached = generate(model, ids, mask, use_cache=False, **options)
    _equal_outputs(cached, uncached)
    assert any(len(s) >= 5 for hyps in cached.sequences for s in hyps)  # the cache was really used


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_encoder_decoder_cached_equals_uncached_on_a_padded_batch(strategy):
    model = encoder_decoder()
    ids, mask = padded_batch(2, LENGTHS, side="right")
    options = dict(max_new_tokens=9, eos_id=EOS, bos_id=BOS, no_repeat_ngram_size=2, **STRATEGIES[strategy])
    _equal_outputs(generate(model, ids, mask, **options), generate(model, ids, mask, use_cache=False, **options))


def test_rnn_use_cache_changes_nothing():
    model = FakeRNNSeq2Seq()
    ids, mask = padded_batch(3, LENGTHS, side="right")
    options = dict(max_new_tokens=8, eos_id=EOS, bos_id=BOS, strategy="beam", num_beams=3)
    _equal_outputs(generate(model, ids, mask, **options), generate(model, ids, mask, use_cache=False, **options))


# ------------------------------------------------------------------------------------------ beam 1 == greedy
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder", "rnn"])
def test_beam_of_one_equals_greedy(family):
    model = {"decoder": decoder, "encoder_decoder": encoder_decoder, "rnn": FakeRNNSeq2Seq}[family]()
    ids, mask = padded_batch(4, LENGTHS, side="left" if family == "decoder" else "right")
    options = dict(max_new_tokens=10, eos_id=EOS, bos_id=BOS)
    greedy = generate(model, ids, mask, **options)
    beam = generate(model, ids, mask, strategy="beam", num_beams=1, **options)
    _equal_outputs(greedy, beam)
    assert beam.scores == beam.log_probs  # length penalty "none": the score is the sum of log-probabilities


def test_top_k_one_sampling_equals_greedy():
    model = decoder(1)
    ids, mask = padded_batch(5, LENGTHS)
    greedy = generate(model, ids, mask, max_new_tokens=10, eos_id=EOS)
    sampled = generate(model, ids, mask, strategy="sample", top_k=1, max_new_tokens=10, eos_id=EOS, seed=123)
    _equal_outputs(greedy, sampled)


# -------------------------------------------------------------------------------- left padding == one by one
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_padded_batch_equals_one_prompt_at_a_time(side, strategy):
    model = decoder(2)
    ids, mask = padded_batch(6, LENGTHS, side=side)  # right padding is re-packed to left padding
    options = dict(max_new_tokens=10, eos_id=EOS, **STRATEGIES[strategy])
    batch = generate(model, ids, mask, **options)
    for row in range(len(LENGTHS)):
        alone = generate(model, unpadded(ids, mask, row), **options)
        assert batch.sequences[row] == alone.sequences[0]
        assert batch.stop_tokens[row] == alone.stop_tokens[0]
        assert batch.scores[row] == pytest.approx(alone.scores[0], abs=1e-9)


def test_source_padding_does_not_change_encoder_decoder_outputs():
    model = encoder_decoder(3)
    ids, mask = padded_batch(7, LENGTHS, side="right")
    options = dict(max_new_tokens=8, eos_id=EOS, bos_id=BOS, strategy="beam", num_beams=2)
    batch = generate(model, ids, mask, **options)
    for row in range(len(LENGTHS)):
        assert batch.sequences[row] == generate(model, unpadded(ids, mask, row), **options).sequences[0]


# -------------------------------------------------------------------------------------------- scores, order
def _teacher_forced_log_prob(model, prompt: torch.Tensor, new: list[int], stop: int | None) -> float:
    tokens = new + ([] if stop is None else [stop])
    full = torch.cat((prompt, torch.tensor([tokens])), dim=1)
    with torch.no_grad():
        logp = model(full).logits.log_softmax(-1)[0]  # (T, V)
    P = prompt.shape[1]
    return sum(float(logp[P - 1 + i, tok]) for i, tok in enumerate(tokens))


def test_beam_hypotheses_are_sorted_and_scored_with_the_model_log_probabilities():
    model = decoder(4)
    ids, mask = padded_batch(8, LENGTHS)
    out = generate(model, ids, mask, strategy="beam", num_beams=4, num_return_sequences=4, max_new_tokens=7,
                   eos_id=EOS, length_penalty="gnmt:1.0")
    for row, (hyps, scores, log_probs, stops) in enumerate(
            zip(out.sequences, out.scores, out.log_probs, out.stop_tokens, strict=True)):
        assert len(hyps) == 4 and len({tuple(h) for h in hyps}) == 4
        assert scores == sorted(scores, reverse=True)
        prompt = unpadded(ids, mask, row)
        for seq, score, log_prob, stop in zip(hyps, scores, log_probs, stops, strict=True):
            assert EOS not in seq and (stop == EOS or len(seq) == 7)
            assert log_prob == pytest.approx(_teacher_forced_log_prob(model, prompt, seq, stop), abs=1e-9)
            n = len(seq) + (stop is not None)
            assert score == pytest.approx(log_prob / ((5 + n) / 6), abs=1e-12)


def test_beam_finds_at_least_the_greedy_log_probability():
    model = decoder(5)
    ids, mask = padded_batch(9, LENGTHS)
    greedy = generate(model, ids, mask, max_new_tokens=8)  # no EOS: every hypothesis has 8 tokens
    beam = generate(model, ids, mask, strategy="beam", num_beams=4, max_new_tokens=8)
    for g, b in zip(greedy.log_probs, beam.log_probs, strict=True):
        assert b[0] >= g[0] - 1e-12


def test_greedy_scores_are_the_model_log_probabilities():
    model = decoder(6)
    ids, mask = padded_batch(10, LENGTHS)
    out = generate(model, ids, mask, max_new_tokens=6, eos_id=EOS)
    for row in range(len(LENGTHS)):
        expected = _teacher_forced_log_prob(model, unpadded(ids, mask, row), out.sequences[row][0],
                                            out.stop_tokens[row][0])
        assert out.log_probs[row][0] == pytest.approx(expected, abs=1e-9)
        assert out.scores[row] == out.log_probs[row]


# ----------------------------------------------------------------------------------------------- stop tokens
def test_stop_tokens_end_a_row_and_are_left_out():
    model = decoder(7)
    ids, mask = padded_batch(11, LENGTHS)
    free = generate(model, ids, mask, max_new_tokens=10)
    # Make a token that row 0 generates (not first) a stop id: row 0 ends there, the others are unaffected
    # unless they meet it.
    seq0 = free.sequences[0][0]
    at = next(i for i in range(1, len(seq0)) if seq0[i] not in seq0[:i])
    stop = seq0[at]
    out = generate(model, ids, mask, max_new_tokens=10, stop_ids=[stop])
    assert out.sequences[0][0] == seq0[:at] and out.stop_tokens[0] == [stop]
    for row in (1, 2):
        seq = free.sequences[row][0]
        cut = seq.index(stop) if stop in seq else len(seq)
        assert out.sequences[row][0] == seq[:cut]
        assert out.stop_tokens[row] == [stop if cut < len(seq) else None]
    padded = out.padded(pad_id=0)
    assert padded.shape == (3, 1, max(len(s[0]) for s in out.sequences))
    assert padded[0, 0, at:].eq(0).all() and padded[0, 0, :at].tolist() == out.sequences[0][0]


def test_sampling_is_reproducible_with_a_seed_and_varies_without():
    model = decoder(8)
    ids, mask = padded_batch(12, LENGTHS)
    options = dict(strategy="sample", max_new_tokens=10, num_return_sequences=3)
    a = generate(model, ids, mask, seed=1, **options)
    assert a.sequences == generate(model, ids, mask, seed=1, **options).sequences
    assert a.sequences != generate(model, ids, mask, seed=2, **options).sequences
    gen = torch.Generator().manual_seed(1)
    assert generate(model, ids, mask, generator=gen, **options).sequences == a.sequences
    assert all(len(h) == 3 for h in a.sequences)
    assert a.sequences != generate(model, ids, mask, **options).sequences  # seed None: a fresh random seed


def test_sampling_follows_the_model_distribution():
    # One step from one prompt: the empirical distribution of 4000 samples matches softmax(logits / T).
    model = decoder(9)
    prompt = random_ids(13, 1, 4)
    temperature = 1.7
    with torch.no_grad():
        probs = (model(prompt).logits[0, -1] / temperature).softmax(-1)
    out = generate(model, prompt, strategy="sample", temperature=temperature, max_new_tokens=1,
                   num_return_sequences=4000, seed=0)
    counts = torch.bincount(torch.tensor([s[0] for s in out.sequences[0]]), minlength=probs.shape[0])
    assert (counts / 4000 - probs).abs().max() < 0.03


def test_the_model_runs_in_eval_mode_and_keeps_its_modes():
    model = decoder(10, dropout=0.5)
    ids, mask = padded_batch(14, LENGTHS)
    expected = generate(model, ids, mask, max_new_tokens=5).sequences
    model.train()
    model.layers[0].eval()  # a frozen submodule stays as it was
    assert generate(model, ids, mask, max_new_tokens=5).sequences == expected
    assert model.training and not model.layers[0].training and model.layers[1].training


def test_max_new_tokens_is_capped_by_the_context_with_a_warning():
    model = decoder(11)  # max_seq_len 24
    prompt = random_ids(15, 1, 20)
    with pytest.warns(UserWarning, match="reduced to 5"):
        out = generate(model, prompt, max_new_tokens=50)
    assert len(out.sequences[0][0]) == 5
    s2s = encoder_decoder()
    with pytest.warns(UserWarning, match="reduced to 24"):
        out = generate(s2s, prompt, bos_id=BOS, max_new_tokens=30)
    assert len(out.sequences[0][0]) == 24
    assert not math.isnan(out.log_probs[0][0])


def test_config_object_and_overrides():
    model = decoder(12)
    ids, mask = padded_batch(16, LENGTHS)
    config = GenerationConfig(strategy="beam", num_beams=2, max_new_tokens=4)
    a = generate(model, ids, mask, config=config)
    b = generate(model, ids, mask, strategy="beam", num_beams=2, max_new_tokens=4)
    assert a.sequences == b.sequences
    assert generate(model, ids, mask, config=config, num_beams=1).sequences == generate(
        model, ids, mask, max_new_tokens=4).sequences


def test_argmax_rows_equals_torch_argmax_with_ties_and_infinities():
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[1, [3, 9]] = 10.0  # a tie: the first index wins, as torch.argmax
    x[2] = float("-inf")
    x[2, 30] = -1.0
    for t in (x, x.float(), x.float()[:, ::2]):
        assert torch.equal(argmax_rows(t), t.argmax(dim=-1))
    assert argmax_rows(x)[1] == 3
