"""Logits processors against direct definitions: repetition penalty, n-gram blocking, temperature, top-k, top-p."""

from __future__ import annotations

import pytest
import torch

from lmforge.generation import (
    GenerationConfig,
    NoRepeatNGram,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
    build_processors,
)
from lmforge.generation.processors import build_warpers

V = 11


def _logits(seed: int, n: int = 3) -> torch.Tensor:
    return 3 * torch.randn(n, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]])
    context = torch.tensor([[2, 0, 1, 1, 4]])
    mask = torch.tensor([[0, 1, 1, 1, 1]])  # token 2 only occurs in the padding: it does not count
    out = RepetitionPenalty(2.0)(logits, context, mask)
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0, 0.25]]  # tokens 0, 1 (twice: penalised once), 4
    assert torch.equal(RepetitionPenalty(1.0)(logits, context, mask), logits)
    assert torch.equal(logits, torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]]))  # not modified in place


def _banned_by_enumeration(context: list[int], n: int) -> set[int]:
    if len(context) < n:
        return set()
    prefix = tuple(context[len(context) - n + 1:]) if n > 1 else ()
    return {context[i + n - 1] for i in range(len(context) - n + 1) if tuple(context[i:i + n - 1]) == prefix}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_matches_enumeration(n):
    gen = torch.Generator().manual_seed(n)
    context = torch.randint(0, 4, (5, 12), generator=gen)  # a small alphabet: many repeats
    mask = torch.ones_like(context)
    mask[1, :5] = 0  # left padding
    mask[2, :11] = 0  # a single real token
    logits = _logits(n, 5)
    out = NoRepeatNGram(n)(logits, context, mask)
    for row in range(5):
        real = context[row][mask[row].bool()].tolist()
        banned = _banned_by_enumeration(real, n)
        assert {int(i) for i in torch.isneginf(out[row]).nonzero().flatten()} == banned, row
        keep = [i for i in range(V) if i not in banned]
        assert torch.equal(out[row, keep], logits[row, keep])


def test_no_repeat_ngram_with_a_short_context_bans_nothing():
    logits = _logits(0, 1)
    assert torch.equal(NoRepeatNGram(3)(logits, torch.tensor([[1, 1]]), torch.ones(1, 2)), logits)
    assert torch.equal(NoRepeatNGram(1)(logits, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0)), logits)


def test_temperature_and_top_k():
    logits = _logits(1)
    empty = torch.zeros(3, 0, dtype=torch.long)
    torch.testing.assert_close(Temperature(0.5)(logits, empty, empty), logits * 2)
    out = TopK(3)(logits, empty, empty)
    for row in range(3):
        kept = set(torch.isfinite(out[row]).nonzero().flatten().tolist())
        assert kept == set(logits[row].topk(3).indices.tolist())
    assert torch.equal(TopK(V + 5)(logits, empty, empty), logits)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.6, 0.9, 0.999])
def test_top_p_keeps_the_smallest_set_reaching_p(p):
    logits = _logits(2, 4)
    empty = torch.zeros(4, 0, dtype=torch.long)
    out = TopP(p)(logits, empty, empty)
    probs = logits.softmax(-1)
    for row in range(4):
        order = probs[row].argsort(descending=True).tolist()
        total, expected = 0.0, set()
        for token in order:  # add tokens, most likely first, until the mass reaches p
            expected.add(token)
            total += float(probs[row, token])
            if total >= p:
                break
        assert set(torch.isfinite(out[row]).nonzero().flatten().tolist()) == expected
    assert torch.equal(TopP(1.0)(logits, empty, empty), logits)


def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    empty = torch.zeros(1, 0, dtype=torch.long)
    out = TopP(1e-6)(logits, empty, empty)
    assert torch.isfinite(out).tolist() == [[True, False, False]]


def test_processor_order_and_strategy():
    config = GenerationConfig(strategy="sample", repetition_penalty=1.2, no_repeat_ngram_size=2, temperature=0.7,
                              top_k=5, top_p=0.9)
    assert [type(p) for p in build_processors(config)] == [RepetitionPenalty, NoRepeatNGram]
    assert [type(p) for p in build_warpers(config)] == [Temperature, TopK, TopP]
    assert build_warpers(GenerationConfig(repetition_penalty=1.2)) == []
    assert build_processors(GenerationConfig()) == []
