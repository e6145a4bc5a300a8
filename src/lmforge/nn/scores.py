"""Attention scores: the scoring functions of the RNN attention lectures, their masked softmax, and what every
attention module returns.

Shape legend: ``...`` any leading dims, Tq / Tk query / key counts, Dq / Dk / Dv query / key / value widths, A hidden
width of the additive score, L max source length; for ``AttentionOutput`` of MultiHeadAttention also B batch,
T target (query) length, S source (key) length, H heads, D model dim.

Masks follow ``lmforge.nn.masks``: bool, True = may attend. Fully masked query rows get zero weights (never NaN).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.nn.kv_cache import KVCache

__all__ = [
    "SCORES",
    "AdditiveScore",
    "AttentionOutput",
    "CosineScore",
    "DotScore",
    "GeneralScore",
    "LocationScore",
    "ScaledDotScore",
    "make_score",
    "masked_softmax",
]


class AttentionOutput(NamedTuple):
    """What every attention module returns.

    Attributes:
        output: context vectors, (B, T, D) for MultiHeadAttention, (..., Tq, Dv) for Attention.
        weights: attention probabilities (B, H, T, S) / (..., Tq, Tk) when requested (``need_weights=True``),
            else None. Taken before attention dropout.
        cache: the KVCache passed in (now extended), or None.
        log_probs: hard attention trained by REINFORCE, in training only: (..., Tq) log pi(s) of the key s sampled
            for each query (0 for a fully masked query); else None.
        entropy: with ``log_probs``, (..., Tq) the entropy of each query's distribution pi over the keys.
    """

    output: Tensor
    weights: Tensor | None = None
    cache: KVCache | None = None
    log_probs: Tensor | None = None
    entropy: Tensor | None = None


# --------------------------------------------------------------------------------------------------------------
# Scoring functions: score(q, k) -> (..., Tq, Tk), higher = more attention.
# --------------------------------------------------------------------------------------------------------------


def _same_width(q: Tensor, k: Tensor, name: str) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise LmforgeError(
            f"the {name!r} score needs queries and keys of the same width; got {q.shape[-1]} and {k.shape[-1]} "
            "(use 'general' or 'additive' for different widths)")


class DotScore(nn.Module):
    """Dot-product score, Luong et al. 2015, "Effective Approaches to Attention-based NMT": score = q . k."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dk) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        _same_width(q, k, "dot")
        return q @ k.transpose(-2, -1)  # (..., Tq, Tk)


class ScaledDotScore(nn.Module):
    """Scaled dot product, Vaswani et al. 2017, "Attention Is All You Need": score = q . k / sqrt(Dk)."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dk) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        _same_width(q, k, "scaled_dot")
        return (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (..., Tq, Tk)


class GeneralScore(nn.Module):
    """Bilinear score, Luong et al. 2015 "general": score = q^T W k with W of shape (Dq, Dk)."""

    def __init__(self, d_q: int, d_k: int) -> None:
        """
        Args:
            d_q: Dq, query width.
            d_k: Dk, key width.
        """
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_q, d_k))  # W: (Dq, Dk)
        nn.init.xavier_uniform_(self.weight)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dq) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        return (q @ self.weight) @ k.transpose(-2, -1)  # (..., Tq, Dk) @ (..., Dk, Tk) -> (..., Tq, Tk)


class AdditiveScore(nn.Module):
    """Additive (concat) score, Bahdanau et al. 2015, "NMT by Jointly Learning to Align and Translate".

    score(q, k) = v^T tanh(W [k; q]), computed as v^T tanh(W_q q + W_k k) (the same thing: W = [W_k W_q]), so queries
    and keys may have different widths and counts. No biases, as in the paper.
    """

    def __init__(self, d_q: int, d_k: int, d_attn: int) -> None:
        """
        Args:
            d_q: Dq, query width (the decoder state s_{i-1} in the paper).
            d_k: Dk, key width (the annotation h_j).
            d_attn: A, hidden width of the alignment MLP.
        """
        super().__init__()
        self.query_proj = nn.Linear(d_q, d_attn, bias=False)  # W_q
        self.key_proj = nn.Linear(d_k, d_attn, bias=False)  # W_k
        self.v = nn.Linear(d_attn, 1, bias=False)  # v^T

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dq) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        h = self.query_proj(q).unsqueeze(-2) + self.key_proj(k).unsqueeze(-3)  # (..., Tq, Tk, A)
        return self.v(torch.tanh(h)).squeeze(-1)  # (..., Tq, Tk)


class CosineScore(nn.Module):
    """Cosine similarity, Graves et al. 2014, "Neural Turing Machines" (content addressing): beta * cos(q, k).

    Deviation: the key strength beta is a constructor constant (``scale``), not emitted by a controller.
    With beta = 1 the scores lie in [-1, 1] and the softmax is close to uniform; raise ``scale`` to sharpen.
    """

    def __init__(self, scale: float = 1.0, eps: float = 1e-8) -> None:
        """
        Args:
            scale: beta, multiplies the cosine.
            eps: floor on the norms (zero vectors score 0).
        """
        super().__init__()
        self.scale, self.eps = scale, eps

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dk) queries.
            k: (..., Tk, Dk) keys.

        Returns:
            (..., Tq, Tk) scores.
        """
        _same_width(q, k, "cosine")
        qn = F.normalize(q, dim=-1, eps=self.eps)
        kn = F.normalize(k, dim=-1, eps=self.eps)
        return self.scale * (qn @ kn.transpose(-2, -1))  # (..., Tq, Tk)


class LocationScore(nn.Module):
    """Location-based score, Luong et al. 2015: a_t = softmax(W_a h_t); depends only on the query.

    Deviation: the paper's output has a fixed length; we take the first Tk of the L = ``max_len`` outputs so a
    batch of shorter sources works (padding is then masked as usual).
    """

    def __init__(self, d_q: int, max_len: int) -> None:
        """
        Args:
            d_q: Dq, query width.
            max_len: L, the longest source this score can address.
        """
        super().__init__()
        self.max_len = max_len
        self.proj = nn.Linear(d_q, max_len, bias=False)  # W_a: (L, Dq)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        """
        Args:
            q: (..., Tq, Dq) queries.
            k: (..., Tk, Dk) keys; only Tk is used.

        Returns:
            (..., Tq, Tk) scores.
        """
        Tk = k.shape[-2]
        if Tk > self.max_len:
            raise LmforgeError(f"the 'location' score was built for max_len={self.max_len} source positions; got {Tk}")
        return self.proj(q)[..., :Tk]  # (..., Tq, Tk)


SCORES: dict[str, type[nn.Module]] = {
    "additive": AdditiveScore,
    "dot": DotScore,
    "scaled_dot": ScaledDotScore,
    "general": GeneralScore,
    "cosine": CosineScore,
    "location": LocationScore,
}

_SCORE_ARGS: dict[str, tuple[str, ...]] = {
    "additive": ("d_q", "d_k", "d_attn"),
    "dot": (),
    "scaled_dot": (),
    "general": ("d_q", "d_k"),
    "cosine": (),
    "location": ("d_q", "max_len"),
}


def make_score(
    name: str,
    *,
    d_q: int | None = None,
    d_k: int | None = None,
    d_attn: int | None = None,
    max_len: int | None = None,
) -> nn.Module:
    """Build a scoring function by name.

    Args:
        name: one of ``SCORES``.
        d_q: query width ('additive', 'general', 'location').
        d_k: key width ('additive', 'general').
        d_attn: hidden width ('additive').
        max_len: longest source ('location').

    Returns:
        A module with ``forward(q, k) -> (..., Tq, Tk)``.
    """
    if name not in SCORES:
        raise LmforgeError(f"unknown attention score {name!r}; choose one of {', '.join(SCORES)}")
    given = {"d_q": d_q, "d_k": d_k, "d_attn": d_attn, "max_len": max_len}
    needed = _SCORE_ARGS[name]
    missing = [a for a in needed if given[a] is None]
    if missing:
        raise LmforgeError(f"the {name!r} score needs {', '.join(missing)}")
    return SCORES[name](**{a: given[a] for a in needed})


# --------------------------------------------------------------------------------------------------------------
# Softmax with masks.
# --------------------------------------------------------------------------------------------------------------


def masked_softmax(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dim restricted to ``mask``; fully masked rows give all-zero weights.

    Args:
        scores: (..., T, S).
        mask: bool broadcastable to scores, True = may attend; or None.

    Returns:
        (..., T, S) weights; each row sums to 1, or to 0 when the row is fully masked.
    """
    if mask is None:
        return scores.softmax(dim=-1)
    # finfo.min, not -inf: a fully masked row becomes uniform (never NaN) and is zeroed below.
    weights = scores.masked_fill(~mask, torch.finfo(scores.dtype).min).softmax(dim=-1)  # (..., T, S)
    row_valid = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    return weights.masked_fill(~row_valid, 0.0)
