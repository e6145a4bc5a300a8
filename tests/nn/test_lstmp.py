"""``ClippedLSTMP`` (``lmforge.nn.lstmp``): without clipping it is ``nn.LSTM(proj_size=...)`` with the same weights
(outputs, states and gradients); with clipping its cell and output stay in [-clip, clip], and one step matches the
formula by hand; padded rows are the rows run alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.nn.lstmp import ClippedLSTMP


def pair(proj: int, seed: int = 0, **clips) -> tuple[ClippedLSTMP, nn.LSTM]:
    torch.manual_seed(seed)
    ours = ClippedLSTMP(5, 8, proj, **clips)
    ref = nn.LSTM(5, 8, batch_first=True, proj_size=proj)
    ref.load_state_dict(ours.state_dict())  # the same parameter names and shapes
    return ours, ref


@pytest.mark.parametrize("proj", [0, 3])
@pytest.mark.parametrize("clip", [None, 1e6])
def test_without_effective_clipping_it_is_nn_lstm_outputs_and_gradients(proj, clip):
    ours, ref = pair(proj, cell_clip=clip, proj_clip=clip)
    P = proj or 8
    x = torch.randn(3, 6, 5, requires_grad=True)
    hx = (torch.randn(1, 3, P), torch.randn(1, 3, 8))
    out, (h, c) = ours(x, hx)
    out_ref, (h_ref, c_ref) = ref(x, hx)
    for a, b in ((out, out_ref), (h, h_ref), (c, c_ref)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum() + c.sum(), [x, *ours.parameters()])
    grads_ref = torch.autograd.grad((out_ref * w).sum() + c_ref.sum(), [x, *ref.parameters()])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=0)


def test_clipping_bounds_the_cell_and_the_projection():
    torch.manual_seed(0)
    layer = ClippedLSTMP(5, 8, 3, cell_clip=0.5, proj_clip=0.2)
    unclipped = ClippedLSTMP(5, 8, 3)
    with torch.no_grad():
        for p in layer.parameters():
            p.mul_(20.0)  # saturated gates: the cell grows by ~1 per step without the clip
        unclipped.load_state_dict(layer.state_dict())
    x = torch.randn(2, 10, 5)
    out, (h, c) = layer(x)
    out_u, (_, c_u) = unclipped(x)
    assert c_u.abs().max() > 0.5 and out_u.abs().max() > 0.2  # the clip has something to do
    assert c.abs().max() <= 0.5 and out.abs().max() <= 0.2 + 1e-7 and h.abs().max() <= 0.2 + 1e-7
    # every step's cell stays inside: run the steps one at a time, carrying the state
    state = None
    for t in range(10):
        _, state = layer(x[:, t:t + 1], state)
        assert state[1].abs().max() <= 0.5


def test_one_step_by_hand():
    torch.manual_seed(1)
    layer = ClippedLSTMP(4, 6, 2, cell_clip=0.3, proj_clip=0.25)
    x, h0, c0 = torch.randn(2, 1, 4), torch.randn(1, 2, 2), torch.randn(1, 2, 6)
    out, (h, c) = layer(x, (h0, c0))
    gates = x[:, 0] @ layer.weight_ih_l0.T + layer.bias_ih_l0 + h0[0] @ layer.weight_hh_l0.T + layer.bias_hh_l0
    i, f, g, o = gates[:, :6], gates[:, 6:12], gates[:, 12:18], gates[:, 18:]
    c_hand = (torch.sigmoid(f) * c0[0] + torch.sigmoid(i) * torch.tanh(g)).clamp(-0.3, 0.3)
    h_hand = ((torch.sigmoid(o) * torch.tanh(c_hand)) @ layer.weight_hr_l0.T).clamp(-0.25, 0.25)
    torch.testing.assert_close(c[0], c_hand)
    torch.testing.assert_close(h[0], h_hand)
    torch.testing.assert_close(out[:, 0], h_hand)


def test_padded_rows_are_the_rows_run_alone_and_empty_rows_keep_their_state():
    torch.manual_seed(2)
    layer = ClippedLSTMP(5, 8, 3, cell_clip=0.5, proj_clip=0.5)
    x = torch.randn(3, 6, 5)
    hx = (torch.randn(1, 3, 3), torch.randn(1, 3, 8))
    lengths = torch.tensor([6, 2, 0])
    out, (h, c) = layer(x, hx, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone, (h_b, c_b) = layer(x[b:b + 1, :n], (hx[0][:, b:b + 1], hx[1][:, b:b + 1]))
        torch.testing.assert_close(out[b, :n], alone[0])
        assert (out[b, n:] == 0).all()
        torch.testing.assert_close(h[:, b], h_b[:, 0])
        torch.testing.assert_close(c[:, b], c_b[:, 0])
    torch.testing.assert_close(h[:, 2], hx[0][:, 2])  # no real step: the state it was given


def test_bad_settings_are_refused():
    with pytest.raises(LmforgeError, match="cell_clip=0"):
        ClippedLSTMP(4, 6, 2, cell_clip=0)
    with pytest.raises(LmforgeError, match="proj_size=6"):
        ClippedLSTMP(4, 6, 6)
