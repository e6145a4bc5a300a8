"""ELMo's scalar mix: a learned, softmax-normalised weighting of a model's layers, scaled by a learned gamma.

Peters et al. 2018, "Deep contextualized word representations", equation (1):

    ELMo_k = gamma * sum_j s_j h_{k,j},        s = softmax(w),  w initialised to 0 (an even mix), gamma to 1

over the layers h_{k,0..L} of any model (the biLM's, or a Transformer's ``hidden_states``). Options, as in the paper
and AllenNLP's ``ScalarMix``:

- ``layer_norm``: normalise each layer before mixing ("in some cases ... apply layer normalization to each biLM layer
  before weighting"): one mean and one variance per layer, over the real tokens of the whole batch (padding never
  counts), as AllenNLP computes them;
- ``dropout``: layer dropout on the weights during training (each w_j is replaced by -inf with probability p before
  the softmax, so a dropped layer gets weight 0 and the others renormalise; if every layer is dropped the mix is
  even). The paper regularises with an L2 penalty lambda ||w||^2 instead; weight decay on ``weights`` is that.

Shape legend: B batch, T sequence length, D layer width, J number of layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError

__all__ = ["ScalarMix"]


class ScalarMix(nn.Module):
    """``gamma * sum_j softmax(w)_j * h_j`` over J layers of equal shape (Peters et al. 2018, equation 1).

    State-dict keys: ``weights`` (J,) (the paper's s before its softmax) and ``gamma`` (1,).
    """

    def __init__(self, n_layers: int, *, layer_norm: bool = False, dropout: float = 0.0, eps: float = 1e-12) -> None:
        """
        Args:
            n_layers: J, how many layers are mixed.
            layer_norm: normalise each layer (over the real tokens) before mixing.
            dropout: probability of dropping a layer's weight during training.
            eps: added to the variance in the normalisation.
        """
        super().__init__()
        if n_layers < 1:
            raise LmforgeError(f"a scalar mix needs at least one layer; got n_layers={n_layers}")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"dropout={dropout} must be in [0, 1)")
        self.n_layers, self.layer_norm, self.dropout, self.eps = n_layers, layer_norm, dropout, eps
        self.weights = nn.Parameter(torch.zeros(n_layers))  # w: (J,), an even mix at the start
        self.gamma = nn.Parameter(torch.ones(1))

    def forward(self, layers: Sequence[Tensor], attention_mask: Tensor | None = None) -> Tensor:
        """
        Args:
            layers: J tensors (B, T, D) (a model's ``hidden_states``).
            attention_mask: (B, T) 1 = real token, 0 = padding; used by ``layer_norm`` only; None = all real.

        Returns:
            (B, T, D) the mix.
        """
        if len(layers) != self.n_layers:
            raise LmforgeError(f"this scalar mix weighs {self.n_layers} layers but got {len(layers)}")
        w = self.weights
        if self.training and self.dropout > 0:
            keep = torch.rand_like(w) >= self.dropout
            w = w.masked_fill(~keep, float("-inf")) if bool(keep.any()) else torch.zeros_like(w)
        s = torch.softmax(w, dim=0)  # (J,)
        mask = None
        if self.layer_norm:
            B, T = layers[0].shape[:2]
            mask = torch.ones(B, T, dtype=layers[0].dtype, device=layers[0].device) if attention_mask is None \
                else attention_mask.to(layers[0].dtype)
        mixed = 0.0
        for j, h in enumerate(layers):
            if mask is not None:
                h = self._normalise(h, mask)
            mixed = mixed + s[j] * h
        return self.gamma * mixed  # (B, T, D)

    def _normalise(self, h: Tensor, mask: Tensor) -> Tensor:
        """(h - mean) / sqrt(var + eps), mean and variance over every entry of the real tokens."""
        m = mask.unsqueeze(-1)  # (B, T, 1)
        n = (m.sum() * h.shape[-1]).clamp(min=1.0)
        mean = (h * m).sum() / n
        var = (((h - mean) * m) ** 2).sum() / n
        return (h - mean) / torch.sqrt(var + self.eps)

    def extra_repr(self) -> str:
        return f"n_layers={self.n_layers}, layer_norm={self.layer_norm}, dropout={self.dropout}"
