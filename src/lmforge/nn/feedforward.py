"""Position-wise feed-forward network and the activation table.

Shape legend: B batch, T length, D model dim, F hidden (d_ff) dim.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.nn.kernels.packed_dropout import Dropout

__all__ = ["ACTIVATIONS", "FeedForward", "gelu_sigmoid"]


def gelu_sigmoid(x: Tensor) -> Tensor:
    """Sigmoid approximation of GELU, Hendrycks & Gimpel 2016: x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,  # Vaswani et al. 2017
    "gelu": F.gelu,  # exact, x * Phi(x) with erf (BERT)
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # tanh approximation (GPT-2, HF "gelu_new")
    "gelu_sigmoid": gelu_sigmoid,  # x * sigmoid(1.702 x) (HF "quick_gelu")
}


class FeedForward(nn.Module):
    """Position-wise feed-forward network, Vaswani et al. 2017, eq. 2: FFN(x) = act(x W1 + b1) W2 + b2.

    ``fc1`` expands D -> F, ``fc2`` projects back F -> D. ``gated`` (Shazeer 2020, "GLU Variants Improve
    Transformer"): ``fc1`` expands D -> 2F, its halves a and b give act(a) * b, then ``fc2``: GEGLU with GELU, as
    Cramming (Geiping & Goldstein 2023) uses. ``dropout`` acts on the hidden activations
    (tensor2tensor's "relu_dropout"); neither the paper nor BERT/GPT-2 use it, so the layers build this with
    dropout 0 and apply their own dropout to the sublayer output.
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True,
        gated: bool = False,
    ) -> None:
        """
        Args:
            d_model: D.
            d_ff: F, hidden width (4 D in the paper, BERT and GPT-2).
            activation: name in ``ACTIVATIONS``.
            dropout: dropout on the hidden activations.
            bias: biases on both linear maps.
            gated: the gated variant (``fc1`` is D -> 2F).
        """
        super().__init__()
        if activation not in ACTIVATIONS:
            raise LmforgeError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"feed-forward dropout must be in [0, 1); got {dropout}")
        self.activation_name = activation
        self.activation = ACTIVATIONS[activation]
        self.gated = gated
        self.fc1 = nn.Linear(d_model, 2 * d_ff if gated else d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """
        Args:
            x: (B, T, D).

        Returns:
            (B, T, D).
        """
        h = self.fc1(x)  # (B, T, F), or (B, T, 2F) gated
        if self.gated:
            a, b = h.chunk(2, dim=-1)  # (B, T, F) each
            h = self.activation(a) * b
        else:
            h = self.activation(h)
        return self.fc2(self.dropout(h))  # (B, T, D)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name!r}" + (", gated" if self.gated else "")
