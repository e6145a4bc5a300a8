"""lmforge.viz.induction: induction and previous-token scores against hand-built attention patterns."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.viz.html import read_attention_html
from lmforge.viz.induction import (
    head_scores,
    induction_pattern_scores,
    induction_scores,
    previous_token_scores,
    repeated_random_ids,
    write_prompt_attention,
)
from tests.viz import tiny_config, tiny_model, tiny_tokenizer


def induction_pattern(ids: torch.Tensor) -> torch.Tensor:
    """(B, T, T): each row attends to the token after the previous occurrence of its own token (itself if none)."""
    B, T = ids.shape
    w = torch.zeros(B, T, T)
    for b in range(B):
        for i in range(T):
            earlier = [j for j in range(i) if ids[b, j] == ids[b, i]]
            w[b, i, earlier[-1] + 1 if earlier else i] = 1.0
    return w


def uniform_causal(B: int, T: int) -> torch.Tensor:
    w = torch.tril(torch.ones(T, T))
    return (w / w.sum(-1, keepdim=True)).expand(B, T, T)


def previous_pattern(B: int, T: int) -> torch.Tensor:
    w = torch.zeros(T, T)
    w[0, 0] = 1.0
    w[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    return w.expand(B, T, T)


class ForcedDecoder(nn.Module):
    """A 'decoder' whose attention is fixed by hand: layer 0 = (previous token, uniform, induction),
    layer 1 = (uniform, induction, previous token)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = tiny_config("decoder", n_heads=3)
        self.calls = 0

    def forward(self, input_ids, output_attentions=False):
        self.calls += 1
        B, T = input_ids.shape
        prev, uni, ind = previous_pattern(B, T), uniform_causal(B, T), induction_pattern(input_ids)
        attentions = (torch.stack([prev, uni, ind], 1), torch.stack([uni, ind, prev], 1))  # (B, H, T, T) each
        return SimpleNamespace(attentions=attentions)


def test_forced_heads_score_one_and_uniform_scores_about_one_over_t():
    model, tok = ForcedDecoder(), tiny_tokenizer()
    scores = head_scores(model, tok, seq_len=9, n_repeats=3, n_samples=5, seed=1)
    assert scores.induction.shape == scores.previous_token.shape == (2, 3)
    np.testing.assert_allclose(scores.induction[0, 2], 1.0)  # a perfect induction head
    np.testing.assert_allclose(scores.induction[1, 1], 1.0)
    T, rows = 27, range(9, 27)
    expected_uniform = np.mean([1 / (i + 1) for i in rows])
    np.testing.assert_allclose(scores.induction[0, 1], expected_uniform, rtol=1e-6)
    np.testing.assert_allclose(scores.uniform, expected_uniform)
    assert 1 / T < scores.uniform < 2 / T
    np.testing.assert_allclose(scores.induction[0, 0], 0.0)  # previous-token head: never on the induction target
    np.testing.assert_allclose(scores.previous_token[0, 0], 1.0)
    np.testing.assert_allclose(scores.previous_token[1, 2], 1.0)
    assert scores.previous_token[0, 2] == 0.0  # the induction head attends two or more back, never one
    assert scores.best() == [(2, 1.0), (1, 1.0)]
    assert scores.best("previous_token") == [(0, 1.0), (2, 1.0)]
    assert scores.to_dict()["best_induction"] == [(2, 1.0), (1, 1.0)]


def test_prefix_is_skipped_and_wrappers_agree():
    model, tok = ForcedDecoder(), tiny_tokenizer()
    kwargs = dict(seq_len=6, n_samples=3, seed=4, prefix=[tok.sep_id])
    ind = induction_scores(model, tok, **kwargs)
    np.testing.assert_allclose(ind[:, [2, 1]].diagonal(), [1.0, 1.0])
    np.testing.assert_allclose(previous_token_scores(model, tok, **kwargs)[0, 0], 1.0)
    np.testing.assert_array_equal(ind, head_scores(model, tok, **kwargs).induction)


def test_pattern_scores_of_one_layer_and_of_a_stack():
    ids = torch.tensor([[5, 6, 7, 8, 5, 6, 7, 8]])
    w = induction_pattern(ids)[:, None]  # (B=1, H=1, T, T)
    np.testing.assert_allclose(induction_pattern_scores(w, 4), [1.0])
    stack = torch.stack([w, uniform_causal(1, 8)[:, None]])  # (L=2, 1, 1, T, T)
    np.testing.assert_allclose(induction_pattern_scores(stack, 4)[:, 0], [1.0, np.mean([1 / 5, 1 / 6, 1 / 7, 1 / 8])])
    with pytest.raises(LmforgeError, match="no second repeat"):
        induction_pattern_scores(w, 8)


def test_repeated_random_ids():
    rng = np.random.default_rng(0)
    ids = repeated_random_ids(range(10, 30), seq_len=7, n_repeats=3, n_samples=4, rng=rng, prefix=[3])
    assert ids.shape == (4, 1 + 21)
    assert (ids[:, 0] == 3).all()
    for row in ids:
        block = row[1:8]
        assert len(set(block)) == 7 and all(10 <= t < 30 for t in block)
        np.testing.assert_array_equal(row[1:], np.tile(block, 3))
    assert len({tuple(r) for r in ids}) == 4  # a new draw per sample
    with pytest.raises(LmforgeError, match="seq_len=21"):
        repeated_random_ids(range(10, 30), seq_len=21, n_repeats=2, n_samples=1, rng=rng)
    with pytest.raises(LmforgeError, match="n_repeats=1"):
        repeated_random_ids(range(10, 30), seq_len=5, n_repeats=1, n_samples=1, rng=rng)


def test_real_decoder_shapes_range_determinism_and_special_tokens_excluded():
    model, tok = tiny_model("decoder"), tiny_tokenizer()
    model.train()
    a = induction_scores(model, tok, seq_len=10, n_samples=4, seed=2)
    b = induction_scores(model, tok, seq_len=10, n_samples=4, seed=2)
    assert a.shape == (2, 2) and ((a >= 0) & (a <= 1)).all()
    np.testing.assert_array_equal(a, b)
    assert model.training  # the mode is restored
    # an untrained model is far from an induction head
    assert a.max() < 0.3
    seen = []
    original = model.forward
    model.forward = lambda ids, **kw: (seen.append(ids.clone()), original(ids, **kw))[1]
    induction_scores(model, tok, seq_len=10, n_samples=2, seed=0)
    assert not set(torch.cat(seen).flatten().tolist()) & set(tok.special_ids)


def test_errors():
    tok = tiny_tokenizer()
    with pytest.raises(LmforgeError, match="causal language model.*encoder"):
        induction_scores(tiny_model("encoder"), tok, seq_len=5)
    with pytest.raises(LmforgeError, match="max_seq_len=64"):
        induction_scores(tiny_model("decoder"), tok, seq_len=20, n_repeats=4)
    with pytest.raises(LmforgeError, match="tokenizer_or_ids"):
        induction_scores(tiny_model("decoder"), 3.5, seq_len=5)
    with pytest.raises(LmforgeError, match="kind="):
        head_scores(ForcedDecoder(), tok, seq_len=5, n_samples=1).best("copying")


def test_write_prompt_attention_round_trips(tmp_path):
    model, tok = tiny_model("decoder"), tiny_tokenizer()
    scores = head_scores(model, tok, seq_len=6, n_samples=2)
    text = "[SEP] alice went to paris"
    path = write_prompt_attention(model, tok, text, tmp_path / "a.html", scores=scores)
    attn = read_attention_html(path)
    (m,) = attn.maps
    assert m.rows[0] == "[SEP]" and m.rows == tok.convert_ids_to_tokens(tok.encode_ids(text))
    assert m.weights.shape == (2, 2, len(m.rows), len(m.rows))
    assert "best induction head per layer (layer 0 head" in attn.title
    with pytest.raises(LmforgeError, match="causal language model"):
        write_prompt_attention(tiny_model("encoder"), tok, text, tmp_path / "b.html")
