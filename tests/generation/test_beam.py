"""Beam search on Markov chains with hand-set or random log-probabilities, checked against exhaustive
enumeration: a myopic greedy, exactness of the stopping rule under every length penalty, the penalty's direction."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.generation import generate
from tests.generation.helpers import MarkovAdapter, exhaustive, random_markov

PROMPTS = torch.zeros(2, 1, dtype=torch.long)  # the chain ignores the prompt; two identical inputs


def _log(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log()


def test_beam_finds_the_better_sequence_when_greedy_is_myopic():
    # Tokens 0..3. Greedy takes token 1 (p 0.6), after which every continuation has p <= 0.34: total 0.204.
    # Token 2 (p 0.4) is followed by token 3 with p 0.9: total 0.36, the best of all 16 two-token sequences.
    first = _log([0.0, 0.6, 0.4, 0.0])
    table = torch.stack([_log([0.25] * 4), _log([0.33, 0.34, 0.33, 0.0]), _log([0.05, 0.0, 0.05, 0.9]),
                         _log([0.25] * 4)])
    chain = MarkovAdapter(first, table)
    best_score, best_seq = exhaustive(chain, 2, set(), "none")[0]
    assert best_seq == [2, 3] and best_score == pytest.approx(math.log(0.36))

    greedy = generate(chain, PROMPTS, max_new_tokens=2)
    assert greedy.sequences[0] == [[1, 1]]
    assert greedy.log_probs[0][0] == pytest.approx(math.log(0.6 * 0.34))
    beam = generate(chain, PROMPTS, strategy="beam", num_beams=2, max_new_tokens=2)
    assert beam.sequences == [[[2, 3]], [[2, 3]]]
    assert beam.log_probs[0][0] == pytest.approx(best_score) and beam.log_probs[0][0] > greedy.log_probs[0][0]


@pytest.mark.parametrize("penalty", ["none", "average", "gnmt:0.6", "gnmt:2.0", "gnmt:-0.5"])
@pytest.mark.parametrize("seed", range(4))
def test_a_wide_beam_returns_the_exact_top_t(penalty, seed):
    # V = 3 (token 0 is EOS), at most 4 tokens. k = 27 = V^3 keeps every candidate of every step (at most
    # 2 x 3 x 3 live prefixes x 3 tokens), so beam search is exhaustive and only its stopping rule could lose a
    # hypothesis.
    chain = random_markov(seed, 3, sharpness=1.5)
    expected = exhaustive(chain, 4, {0}, penalty)[:5]
    out = generate(chain, PROMPTS, strategy="beam", num_beams=27, num_return_sequences=5, max_new_tokens=4,
                   eos_id=0, length_penalty=penalty)
    got = [seq + ([] if stop is None else [stop]) for seq, stop in zip(out.sequences[0], out.stop_tokens[0],
                                                                       strict=True)]
    assert out.scores[0] == pytest.approx([s for s, _ in expected], abs=1e-12)
    assert sorted(map(tuple, got)) == sorted(tuple(s) for _, s in expected)  # ties may come in either order
    for seq, log_prob in zip(got, out.log_probs[0], strict=True):
        assert log_prob == pytest.approx(chain.log_prob(seq), abs=1e-12)
    assert out.sequences[1] == out.sequences[0]  # the second (identical) input gets the same answer


def test_beam_stops_early_once_no_live_hypothesis_can_win():
    # EOS (token 0) first has p 0.6; token 1 (p 0.39) is followed by itself with p 0.89. With no length penalty the
    # finished [EOS] beats the live [1] at once (log 0.39 < log 0.6, and extending only lowers it): one step.
    first = _log([0.6, 0.39, 0.01])
    table = torch.stack([_log([1 / 3] * 3), _log([0.1, 0.89, 0.01]), _log([0.1, 0.45, 0.45])])
    chain = MarkovAdapter(first, table)
    out = generate(chain, PROMPTS[:1], strategy="beam", num_beams=2, max_new_tokens=50, eos_id=0)
    assert out.sequences == [[[]]] and out.stop_tokens == [[0]]
    assert chain.steps == 0  # decided from the first logits
    # With "average" the live [1] could still reach log(0.39) / 50 > log(0.6): the search goes on, and finds
    # the long run of 1s that the average prefers.
    out = generate(chain, PROMPTS[:1], strategy="beam", num_beams=2, max_new_tokens=6, eos_id=0,
                   length_penalty="average")
    assert chain.steps >= 5
    assert out.sequences[0][0] == [1] * 6
    assert out.scores[0][0] == pytest.approx(exhaustive(chain, 6, {0}, "average")[0][0])


def test_a_larger_alpha_favours_longer_outputs():
    # After token 1, EOS (0) is likely but token 2 leads to a long, confident tail: a short hypothesis [1, EOS]
    # against [1, 2, 2, 2, 2, EOS]-like ones. alpha = 0 (none) picks the short one, a large alpha the long one.
    first = _log([0.05, 0.9, 0.05])
    table = torch.stack([_log([1 / 3] * 3), _log([0.6, 0.05, 0.35]), _log([0.1, 0.02, 0.88])])
    chain = MarkovAdapter(first, table)
    lengths = {}
    for alpha in (0.0, 0.6, 1.5, 3.0):
        out = generate(chain, PROMPTS[:1], strategy="beam", num_beams=4, max_new_tokens=8, eos_id=0,
                       length_penalty=f"gnmt:{alpha}")
        lengths[alpha] = len(out.sequences[0][0])
        assert out.scores[0][0] == pytest.approx(exhaustive(chain, 8, {0}, f"gnmt:{alpha}")[0][0])
    assert lengths[0.0] == 1
    assert lengths[0.0] <= lengths[0.6] <= lengths[1.5] <= lengths[3.0] and lengths[3.0] > 1


def test_a_small_vocabulary_can_leave_fewer_than_t_hypotheses():
    chain = random_markov(0, 2)
    out = generate(chain, PROMPTS[:1], strategy="beam", num_beams=8, num_return_sequences=8, max_new_tokens=2)
    assert sorted(out.sequences[0]) == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert out.scores[0] == sorted(out.scores[0], reverse=True)


@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_every_token_forbidden_is_a_clear_error(strategy):
    # Vocabulary of 2 and no token may repeat: nothing can follow two tokens.
    chain = random_markov(0, 2)
    with pytest.raises(LmforgeError, match="every token is forbidden.*no_repeat_ngram_size"):
        generate(chain, PROMPTS[:1], strategy=strategy, max_new_tokens=3, no_repeat_ngram_size=1, num_beams=2)
