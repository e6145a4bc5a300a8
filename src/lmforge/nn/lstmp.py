"""An LSTM layer with a projection and clipping (LSTMP, Sak et al. 2014), as bilm-tf and ELMo train it.

Shape legend: B batch, T steps, I input width, C cell width, P output width (the projection; C when there is
none).

One step, PyTorch's gate order and parameter names (so the weights are ``nn.LSTM(I, C, proj_size=P)``'s)::

    i, f, g, o = split(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh, 4)          (B, 4C) -> 4 x (B, C)
    c_t = clip(sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g), cell_clip)   (B, C)
    h_t = clip(W_hr (sigmoid(o) * tanh(c_t)), proj_clip)                 (B, P)   (no W_hr when P = C)

``clip(x, a)`` = min(max(x, -a), a), or x when a is None. bilm-tf (and AllenNLP's ``LstmCellWithProjection``)
clip both at 3 (ELMo's options file: ``cell_clip`` 3, ``proj_clip`` 3). ``nn.LSTM``'s fused kernel cannot clip, so
this layer loops over the steps in Python: the input half ``W_ih x_t + b_ih + b_hh`` is computed for all steps in
one matrix product first, leaving one (B, P) x (P, 4C) product and a few element-wise operations per step. Without
clipping it computes exactly what ``nn.LSTM`` does (tested to 1e-5), only slower; the biLM uses ``nn.LSTM`` then.

Padding: ``lengths`` (B,) for right-padded inputs; a row stops updating its state after its last real step (its
final (h, c) is the state after that step) and its outputs past it are 0, as with a packed ``nn.LSTM``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError

__all__ = ["ClippedLSTMP", "lstmp_layer"]


class ClippedLSTMP(nn.Module):
    """One unidirectional LSTM layer with an optional projection and cell / projection clipping (see the module
    docstring). ``forward(x, hx, lengths)`` is ``nn.LSTM(..., batch_first=True)``'s for one layer.

    Args:
        input_size: I.
        hidden_size: C, the cell width.
        proj_size: P < C, or 0 for no projection (h is then the C-wide cell output).
        cell_clip, proj_clip: clip c_t to [-cell_clip, cell_clip] and h_t (after the projection) to
            [-proj_clip, proj_clip]; None = no clipping.
    """

    def __init__(self, input_size: int, hidden_size: int, proj_size: int = 0, *, cell_clip: float | None = None,
                 proj_clip: float | None = None) -> None:
        super().__init__()
        if not 0 <= proj_size < hidden_size:
            raise LmforgeError(f"proj_size={proj_size} must be in [0, hidden_size={hidden_size}) (0: no projection)")
        for name, value in (("cell_clip", cell_clip), ("proj_clip", proj_clip)):
            if value is not None and not 0 < value < math.inf:
                raise LmforgeError(f"{name}={value} must be a positive number (bilm-tf: 3), or None for no clipping")
        self.input_size, self.hidden_size, self.proj_size = input_size, hidden_size, proj_size
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
        P = proj_size or hidden_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size, P))
        self.bias_ih_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh_l0 = nn.Parameter(torch.empty(4 * hidden_size))
        self.weight_hr_l0 = nn.Parameter(torch.empty(proj_size, hidden_size)) if proj_size else None
        bound = 1.0 / math.sqrt(hidden_size)  # nn.LSTM's initialisation
        for weight in self.parameters():
            nn.init.uniform_(weight, -bound, bound)

    @property
    def output_size(self) -> int:
        return self.proj_size or self.hidden_size

    def forward(self, x: Tensor, hx: tuple[Tensor, Tensor] | None = None,
                lengths: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """
        Args:
            x: (B, T, I) inputs, batch first.
            hx: (h (1, B, P), c (1, B, C)) the state before step 0; None = zeros.
            lengths: (B,) the real steps of each right-padded row; None = all T.

        Returns:
            outputs (B, T, P) (0 past a row's length) and the final (h (1, B, P), c (1, B, C)).
        """
        B, T, _ = x.shape
        C, P = self.hidden_size, self.output_size
        if hx is None:
            h, c = x.new_zeros(B, P), x.new_zeros(B, C)
        else:
            h, c = hx[0][0], hx[1][0]
        # the input half of every gate, all steps at once: (B, T, 4C)
        pre = torch.addmm(self.bias_ih_l0 + self.bias_hh_l0, x.reshape(B * T, self.input_size),
                          self.weight_ih_l0.T).view(B, T, 4 * C)
        w_hh, w_hr = self.weight_hh_l0.T, None if self.weight_hr_l0 is None else self.weight_hr_l0.T
        active = None if lengths is None else (torch.arange(T, device=x.device) < lengths.to(x.device).unsqueeze(-1))
        outputs = []
        for t in range(T):
            gates = torch.addmm(pre[:, t], h, w_hh)  # (B, 4C)
            i, f, g, o = gates.chunk(4, dim=-1)
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            if self.cell_clip is not None:
                c_new = c_new.clamp(-self.cell_clip, self.cell_clip)
            h_new = torch.sigmoid(o) * torch.tanh(c_new)
            if w_hr is not None:
                h_new = h_new @ w_hr
            if self.proj_clip is not None:
                h_new = h_new.clamp(-self.proj_clip, self.proj_clip)
            if active is not None:  # a row past its length keeps its state and outputs 0
                keep = active[:, t].unsqueeze(-1)  # (B, 1)
                h, c = torch.where(keep, h_new, h), torch.where(keep, c_new, c)
                outputs.append(h_new * keep.to(h_new.dtype))
            else:
                h, c = h_new, c_new
                outputs.append(h_new)
        out = torch.stack(outputs, dim=1) if outputs else x.new_zeros(B, 0, P)
        return out, (h.unsqueeze(0), c.unsqueeze(0))

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, proj_size={self.proj_size}, cell_clip={self.cell_clip}, "
                f"proj_clip={self.proj_clip}")


def lstmp_layer(d_in: int, d_cell: int, d_out: int, cell_clip: float | None = None,
                proj_clip: float | None = None) -> nn.Module:
    """One LSTM layer with a projection (LSTMP, Sak et al. 2014) when the cell is wider than the output: PyTorch's
    fused ``nn.LSTM`` without clipping, ``ClippedLSTMP`` (the same parameters, a loop over the steps) with it."""
    proj = d_out if d_cell > d_out else 0
    if not cell_clip and not proj_clip:  # None or 0: no clipping
        return nn.LSTM(d_in, d_cell, batch_first=True, proj_size=proj)
    return ClippedLSTMP(d_in, d_cell, proj, cell_clip=cell_clip or None, proj_clip=proj_clip or None)
