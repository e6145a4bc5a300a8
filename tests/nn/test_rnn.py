"""Recurrent blocks: a packed padded batch equals its rows run one by one (GRU/LSTM, one or two directions, padding
anywhere), final states, attention pooling that ignores padding and whose weights sum to 1."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.nn.attention import CosineScore, GeneralScore
from lmforge.nn.rnn import AttentionPooling, StackedRNN, compact_padding, make_rnn, make_state_score

B, T, DIN, D = 3, 7, 5, 12


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows: right-padded (4 real), left-padded with a hole (real at 1, 2, 4, 5, 6), full."""
    x = torch.randn(B, T, DIN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 4:] = 0
    mask[1, [0, 3]] = 0
    return x, mask


def _stack(cell: str = "gru", bidirectional: bool = True, n_layers: int = 2, dropout: float = 0.0) -> StackedRNN:
    torch.manual_seed(0)
    return StackedRNN(cell, DIN, D, n_layers=n_layers, bidirectional=bidirectional, dropout=dropout).double().eval()


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_padded_batch_equals_rows_one_by_one(cell, bidirectional):
    rnn = _stack(cell, bidirectional)
    x, mask = _inputs()
    with torch.no_grad():
        out = rnn(x, mask, output_all_layers=True)
        assert out.states.shape == (B, T, D) and out.hidden.shape == (2, B, D)
        assert (out.cell is None) == (cell == "gru")
        for b in range(B):
            keep = mask[b] == 1
            alone = rnn(x[b:b + 1, keep], output_all_layers=True)  # (1, n, Din): no padding at all
            torch.testing.assert_close(out.states[b, keep], alone.states[0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(out.hidden[:, b], alone.hidden[:, 0], rtol=1e-12, atol=1e-12)
            if cell == "lstm":
                torch.testing.assert_close(out.cell[:, b], alone.cell[:, 0], rtol=1e-12, atol=1e-12)
            for layer in range(2):
                torch.testing.assert_close(out.layer_states[layer][b, keep], alone.layer_states[layer][0])
    # padded positions are exactly zero, in every layer
    for states in out.layer_states:
        assert float(states.masked_select((mask == 0).unsqueeze(-1).expand_as(states)).abs().max()) == 0.0
    assert out.layer_states[-1] is out.states
    # and what the padding held never matters
    noisy = x.masked_fill((mask == 0).unsqueeze(-1), 100.0)
    with torch.no_grad():
        torch.testing.assert_close(rnn(noisy, mask).states, out.states, rtol=0, atol=0)


def test_final_states_are_the_ends_of_each_direction():
    rnn = _stack("gru", n_layers=1)
    x, mask = _inputs(1)
    with torch.no_grad():
        out = rnn(x, mask)
    half = D // 2
    for b in range(B):
        real = mask[b].nonzero().flatten()
        first, last = int(real[0]), int(real[-1])
        torch.testing.assert_close(out.hidden[0, b, :half], out.states[b, last, :half])  # -> after the last token
        torch.testing.assert_close(out.hidden[0, b, half:], out.states[b, first, half:])  # <- after the first


def test_an_empty_row_gives_zero_states_and_finite_finals():
    rnn = _stack("lstm")
    x, mask = _inputs()
    mask[2] = 0
    with torch.no_grad():
        out = rnn(x, mask)
    assert float(out.states[2].abs().max()) == 0.0
    assert bool(torch.isfinite(out.hidden).all()) and bool(torch.isfinite(out.cell).all())


def test_no_mask_means_all_real_and_dropout_acts_only_in_training():
    rnn = _stack(dropout=0.5)
    x, _ = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(rnn(x).states, rnn(x, torch.ones(B, T)).states, rtol=0, atol=0)
        rnn.train()
        a, b = rnn(x).states, rnn(x).states
    assert not torch.equal(a, b)  # dropout between the two layers
    assert {k.split(".")[0] for k in rnn.state_dict()} == {"0", "1"}  # entries are the layers: "0.*", "1.*"


def test_compact_padding_moves_real_tokens_first_in_order():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)
    order, lengths = compact_padding(mask)
    assert lengths.tolist() == [2, 2, 4]
    assert order[1, :2].tolist() == [1, 3] and order[0, :2].tolist() == [0, 1]
    assert compact_padding(mask[[0, 2]])[0] is None  # already right-padded: nothing to move


def test_bad_arguments_are_clear_errors():
    with pytest.raises(LmforgeError, match="unknown RNN cell 'rnn'"):
        make_rnn("rnn", 3, 4)
    with pytest.raises(LmforgeError, match="even d_model"):
        StackedRNN("gru", 3, 5)
    with pytest.raises(LmforgeError, match="attention_mask must be"):
        _stack()(*_inputs()[:1], torch.ones(B, T + 1))
    with pytest.raises(LmforgeError, match="max_len"):
        AttentionPooling(D, "location")


def test_make_state_score_gives_cosine_strength_sqrt_d():
    score = make_state_score("cosine", 16)
    assert isinstance(score, CosineScore) and score.scale == pytest.approx(math.sqrt(16))
    assert isinstance(make_state_score("general", 16), GeneralScore)


@pytest.mark.parametrize("score", ["dot", "scaled_dot", "general", "additive", "cosine", "location"])
def test_attention_pooling_ignores_padding_and_weights_sum_to_one(score):
    torch.manual_seed(0)
    pool = AttentionPooling(D, score, max_len=T).double()
    h = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    _, mask = _inputs()
    pooled, weights = pool(h, mask)
    assert pooled.shape == (B, D) and weights.shape == (B, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, dtype=torch.float64))
    assert float(weights.detach().masked_select(mask == 0).abs().max()) == 0.0
    torch.testing.assert_close(pooled, torch.einsum("bt,btd->bd", weights, h))
    # other values at the padded positions change nothing
    noisy = h.masked_fill((mask == 0).unsqueeze(-1), 7.0)
    torch.testing.assert_close(pool(noisy, mask)[0], pooled, rtol=0, atol=0)
    # a row pooled alone gives the same vector
    for b in range(B):
        alone, _ = pool(h[b:b + 1, mask[b] == 1])
        torch.testing.assert_close(alone[0], pooled[b])
    # the query is trained: it gets a gradient
    pooled.sum().backward()
    assert pool.query.grad is not None and float(pool.query.grad.abs().sum()) > 0


def test_attention_pooling_of_an_empty_row_is_zero():
    pool = AttentionPooling(D, "dot").double()
    h = torch.randn(2, T, D, dtype=torch.float64)
    mask = torch.ones(2, T)
    mask[1] = 0
    with torch.no_grad():
        pooled, weights = pool(h, mask)
        assert float(pooled[1].abs().max()) == 0.0 and float(weights[1].abs().max()) == 0.0
        # no mask = every position real
        torch.testing.assert_close(pool(h[:1])[0], pooled[:1])
