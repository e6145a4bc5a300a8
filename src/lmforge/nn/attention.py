"""Multi-head attention (Vaswani et al. 2017) and its scaled dot-product kernels.

Shape legend: B batch, T target (query) length, S source (key) length, H heads, Dh head dim, D model dim.

Masks follow ``lmforge.nn.masks``: bool, True = may attend; ``attention_mask`` (B, S) with 1 = real token,
0 = padding. Fully masked query rows get zero weights and a zero output (never NaN).

The rest of what this module used to hold lives in its own files and is re-exported here, so that every old import
keeps working: the scoring functions, ``masked_softmax`` and ``AttentionOutput`` (``lmforge.nn.scores``), the
generic (lecture) ``Attention`` (``lmforge.nn.generic_attention``), REINFORCE for hard attention
(``lmforge.nn.reinforce``) and the ``KVCache`` (``lmforge.nn.kv_cache``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.nn.capture import capturing, exporting, one_graph
from lmforge.nn.generic_attention import Attention
from lmforge.nn.kernels.dropout_attention import dropout_attention, plain_dropout_attention
from lmforge.nn.kernels.lowp_attention import lowp_attention, lowp_pays
from lmforge.nn.kernels.packed_dropout import dropout, scales_in_mask
from lmforge.nn.kernels.packing import Packing, ReadRows
from lmforge.nn.kv_cache import KVCache
from lmforge.nn.masks import combine_masks, guard_empty_rows, make_causal_mask, padding_to_key_mask
from lmforge.nn.reinforce import RewardBaseline, SampledAlignments, reinforce_loss
from lmforge.nn.scores import (
    SCORES,
    AdditiveScore,
    AttentionOutput,
    CosineScore,
    DotScore,
    GeneralScore,
    LocationScore,
    ScaledDotScore,
    make_score,
    masked_softmax,
)

__all__ = [
    "KERNELS",
    "SCORES",
    "AdditiveScore",
    "Attention",
    "AttentionOutput",
    "CosineScore",
    "DotScore",
    "GeneralScore",
    "KVCache",
    "LocationScore",
    "MultiHeadAttention",
    "RewardBaseline",
    "SampledAlignments",
    "ScaledDotScore",
    "attention_weights",
    "make_score",
    "masked_softmax",
    "math_attention",
    "reinforce_loss",
    "sdpa_attention",
]


# --------------------------------------------------------------------------------------------------------------
# Kernels: scaled dot-product attention, the readable reference and the fast one.
# --------------------------------------------------------------------------------------------------------------


def _fold_causal(mask: Tensor | None, is_causal: bool, T: int, S: int, device: torch.device) -> Tensor | None:
    if not is_causal:
        return mask
    return combine_masks(mask, make_causal_mask(T, S, device=device))  # (..., T, S)


def attention_weights(
    q: Tensor, k: Tensor, mask: Tensor | None = None, is_causal: bool = False, scale: float | None = None
) -> Tensor:
    """Scaled dot-product attention probabilities (the readable reference).

    Args:
        q: (B, H, T, Dh) queries.
        k: (B, H, S, Dh) keys.
        mask: bool broadcastable to (B, H, T, S), True = may attend; or None.
        is_causal: also apply the causal mask; queries are the last T of the S positions (see make_causal_mask).
        scale: score multiplier, default 1 / sqrt(Dh).

    Returns:
        (B, H, T, S) weights (rows sum to 1; fully masked rows are 0).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, S)
    mask = _fold_causal(mask, is_causal, q.shape[-2], k.shape[-2], q.device)
    return masked_softmax(scores, mask)  # (B, H, T, S)


def math_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool, scale: float | None
) -> Tensor:
    """Reference kernel: softmax(q k^T * scale + mask) v, written out.

    Args:
        q: (B, H, T, Dh); k, v: (B, H, S, Dh).
        mask: bool broadcastable to (B, H, T, S), True = may attend; or None.
        dropout_p: dropout on the weights (pass 0 at eval).
        is_causal: add the bottom-right-aligned causal mask.
        scale: score multiplier, default 1 / sqrt(Dh).

    Returns:
        (B, H, T, Dh).
    """
    weights = attention_weights(q, k, mask, is_causal, scale)  # (B, H, T, S)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return weights @ v  # (B, H, T, Dh)


def sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool, scale: float | None
) -> Tensor:
    """Fast kernel: ``torch.nn.functional.scaled_dot_product_attention`` with the same semantics as math_attention.

    Differences from calling torch directly, all to match the reference: ``is_causal`` is bottom-right aligned
    (torch's is top-left, wrong for cached decoding when T < S), and fully masked rows give zeros on every torch
    version.

    Args and Returns: as ``math_attention``.
    """
    T, S = q.shape[-2], k.shape[-2]
    if is_causal and T == 1:  # one new query (a cached decoding step): its bottom-right causal row allows every key
        is_causal = False
    if exporting():
        return exported_attention(q, k, v, _fold_causal(mask, is_causal, T, S, q.device), scale)
    if not capturing() and lowp_pays(q, T, S):
        # bf16 (autocast) on a CPU: torch's flash kernel is slow there (its backward above all), and its dropout path
        # runs the math kernel; the scores, softmax and any dropout mask in fp32 in cache-sized chunks, the products
        # with v in bf16, to the flash kernel's precision (lmforge.nn.kernels.lowp_attention)
        return lowp_attention(q, k, v, _fold_causal(mask, is_causal, T, S, q.device), scale, dropout_p=dropout_p)
    if dropout_p > 0.0 and q.device.type == "cpu" and q.is_floating_point():
        # torch's CPU SDPA has no fused kernel with dropout: its math path, with a mask a third as costly
        # compiled: the same mask written out for autograd; the cache-sized chunks are Python loops over concrete
        # sizes, which would compile again for every new length (4% slower a step at bert-mini's size, BENCHMARKS)
        kernel = plain_dropout_attention if capturing() else dropout_attention
        folded = _fold_causal(mask, is_causal, T, S, q.device)
        if scales_in_mask(q):
            return kernel(q, k, v, folded, dropout_p, scale)
        # fp16, bf16 beyond lowp_attention's sizes, compiled: the weights in fp32, as torch's math path computes its
        # scores, outside autocast (which would cast the products back); 1.4x torch's bf16 math path at bert-base's
        # shape
        with torch.autocast(q.device.type, enabled=False):
            return kernel(q.float(), k.float(), v.float(), folded, dropout_p, scale).to(q.dtype)
    if mask is None and (not is_causal or T == S):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    mask = _fold_causal(mask, is_causal, T, S, q.device)
    assert mask is not None
    safe_mask, row_valid = guard_empty_rows(mask)  # (B|1, H|1, T, S), (B|1, H|1, T, 1)
    # the usual case (right padding, no empty rows): skip two full-size copies (compiled: a graph break that pays;
    # exported: the general path, one graph)
    if not one_graph() and bool(row_valid.all()):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, dropout_p=dropout_p, scale=scale)
    return out.masked_fill(~row_valid, 0.0)  # (B, H, T, Dh)


def exported_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float | None) -> Tensor:
    """What an exported graph computes (``torch.export``, the ONNX export of ``lmforge.persistence.onnx``): softmax(q
    k^T * scale + bias) v, the mask an additive bias of the dtype's lowest value, written out as MatMul, Add,
    Softmax, MatMul. SDPA's decomposition with a bool mask adds a Where over every (B, H, T, S) score and NaN
    guards, which cost ONNX Runtime 10% of BERT's time. The one difference from ``sdpa_attention``: a query row with
    no key at all (only a row of padding, whose outputs nothing reads) averages the values instead of giving zeros.
    No dropout: an exported graph is for inference.

    Args: q, k, v, mask, scale as ``math_attention``'s (the causal mask already folded into ``mask``).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if mask is not None:  # a (B|1, H|1, T|1, S) bias, built on the mask's own small shape
        bias = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device)
        scores = scores + bias.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return scores.softmax(-1) @ v  # (B, H, T, Dh)


Kernel = Callable[[Tensor, Tensor, Tensor, Tensor | None, float, bool, float | None], Tensor]

KERNELS: dict[str, Kernel] = {"math": math_attention, "sdpa": sdpa_attention}


# --------------------------------------------------------------------------------------------------------------
# Multi-head attention.
# --------------------------------------------------------------------------------------------------------------


def _plain_linears(modules: tuple[nn.Module, ...]) -> bool:
    """Every module is an ``nn.Linear`` itself (not a subclass or wrapper) with no hooks or parametrization, so its
    output is exactly ``F.linear(x, weight, bias)`` and its weights may be concatenated with others'."""
    return all(type(m) is nn.Linear and not m._forward_hooks and not m._forward_pre_hooks
               and "parametrizations" not in m._modules for m in modules)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017, "Attention Is All You Need", section 3.2.2.

    MultiHead(Q, K, V) = Concat(head_1..head_H) W_O, head_i = Attention(Q W_Q_i, K W_K_i, V W_V_i), with
    scaled dot-product attention computed by a kernel from ``KERNELS`` (all share one signature; "math" is the
    reference and the test oracle of "sdpa").

    Separate ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` with biases, as in BERT (GPT-2's fused ``c_attn`` is
    split by the interop layer). Self-attention when ``key_value`` is None, cross-attention otherwise.
    Rotary embeddings, when injected, are applied to q and k in self-attention only, at positions offset by the
    cache length. Attention dropout acts on the weights, in training only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kernel: str = "sdpa",
        d_kv: int | None = None,
        rotary: nn.Module | None = None,
    ) -> None:
        """
        Args:
            d_model: D, width of queries and of the output.
            n_heads: H; must divide D (Dh = D / H).
            dropout: attention-weight dropout probability.
            bias: biases on the four projections.
            kernel: name in ``KERNELS``.
            d_kv: width of the key/value input for cross-attention from another width (default D).
            rotary: e.g. ``RotaryEmbedding(d_head, max_len)``; called as ``rotary(x, offset)`` on (B, H, T, Dh).
        """
        super().__init__()
        if n_heads <= 0 or d_model <= 0 or d_model % n_heads:
            raise LmforgeError(
                f"d_model={d_model} must be a positive multiple of n_heads={n_heads} (each head gets d_model / "
                "n_heads dimensions)")
        if kernel not in KERNELS:
            raise LmforgeError(f"unknown attention kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
        if not 0.0 <= dropout < 1.0:
            raise LmforgeError(f"attention dropout must be in [0, 1); got {dropout}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.d_kv = d_model if d_kv is None else d_kv
        self.dropout, self.kernel_name = dropout, kernel
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(self.d_kv, d_model, bias=bias)
        self.v_proj = nn.Linear(self.d_kv, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.rotary = rotary
        self.fuse_projections = True  # one q/k/v product when decoding with a cache (see _project_qkv)

    def _project_qkv(self, x: Tensor, cache: KVCache | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The self-attention projections x W_Q, x W_K, x W_V, each (..., D).

        Incremental decoding (a ``cache``, no autograd) runs one product with the three weights side by side: one
        GEMM instead of three, two fewer calls per layer and step. The concatenated weight is built at the cache's
        first call and lives in the cache, so it is dropped with it at the end of one generation: the weights cannot
        change meanwhile, and no copy outlives them (an optimizer step, fused or not, never meets a stale one).
        Projections that are not plain ``nn.Linear`` modules without hooks (a wrapper, a parametrization) always run
        as they are. The parameters and their state-dict keys stay the three separate projections.
        """
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if cache is None or not self.fuse_projections or (
                torch.is_grad_enabled() and any(p.weight.requires_grad for p in projections)):
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if cache.projection is None:  # the first step of a generation: may these three be fused at all?
            if not _plain_linears(projections):
                return self.q_proj(x), self.k_proj(x), self.v_proj(x)
            with torch.no_grad():
                weight = torch.cat([proj.weight for proj in projections])  # (3D, D)
                bias = None if self.q_proj.bias is None else torch.cat([proj.bias for proj in projections])
            cache.projection = (weight, bias)
        return F.linear(x, *cache.projection).split(self.d_model, dim=-1)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, Dh)

    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        *,
        attention_mask: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        packing: Packing | None = None,
    ) -> AttentionOutput:
        """Attend from ``query`` to itself (self-attention) or to ``key_value`` (cross-attention).

        Args:
            query: (B, T, D).
            key_value: (B, S, d_kv) for cross-attention; None for self-attention. With a filled cross-attention
                cache it is not projected again (pass the encoder output anyway).
            attention_mask: (B, S) 1 = real key, 0 = padding. S counts all keys: with a self-attention cache,
                the cached positions plus the T new ones.
            causal: queries attend only to keys at or before their position; the queries are the last T of
                the S positions (cached decoding).
            attn_mask: extra bool mask broadcastable to (B, H, T, S), True = may attend.
            cache: a KVCache to read and extend (incremental decoding).
            need_weights: also return the (B, H, T, S) weights; this call then runs the math path (whatever the
                kernel) so the weights are exactly those used.
            packing: self-attention without a cache on a packed batch (``lmforge.nn.kernels.packing``): ``query`` is the
                (N, D) rows of the real tokens; the projections run on them, attention on the padded layout.

        Returns:
            AttentionOutput(output (B, T, D), or (N, D) with ``packing``; weights (B, H, T, S) or None; cache).
        """
        if packing is not None:
            return self._packed_self_attention(query, packing, attention_mask, attn_mask, need_weights)
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise LmforgeError(f"query must be (batch, length, d_model={self.d_model}); got {tuple(query.shape)}")
        B, T, _ = query.shape
        if key_value is None:  # self-attention: new keys/values come from the query sequence
            q, k, v = (self._split_heads(x) for x in self._project_qkv(query, cache))  # (B, H, T, Dh) each
            if self.rotary is not None:
                offset = 0 if cache is None else cache.length
                q, k = self.rotary(q, offset), self.rotary(k, offset)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, S, Dh), S = cached + T
        elif cache is not None and cache.key is not None and cache.value is not None:
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            k, v = cache.key, cache.value  # cross-attention: encoder keys/values projected once
        else:
            if key_value.dim() != 3 or key_value.shape[-1] != self.d_kv:
                raise LmforgeError(
                    f"key_value must be (batch, length, d_kv={self.d_kv}); got {tuple(key_value.shape)}")
            q = self._split_heads(self.q_proj(query))  # (B, H, T, Dh)
            k = self._split_heads(self.k_proj(key_value))  # (B, H, S, Dh)
            v = self._split_heads(self.v_proj(key_value))  # (B, H, S, Dh)
            if cache is not None:
                cache.append(k, v)
        S = k.shape[-2]
        mask = attn_mask
        if mask is not None and mask.dtype != torch.bool:
            raise LmforgeError(f"attn_mask must be bool (True = may attend); got dtype {mask.dtype}")
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (B, S):
                raise LmforgeError(
                    f"attention_mask must be (batch={B}, keys={S}) with 1 = real token; got "
                    f"{tuple(attention_mask.shape)}")
            mask = combine_masks(padding_to_key_mask(attention_mask), mask)  # (B, 1|H, 1|T, S)
        if causal and S < T:
            raise LmforgeError(f"causal attention needs at least as many keys as queries; got T={T}, S={S}")
        dropout_p = self.dropout if self.training else 0.0
        scale = self.d_head**-0.5
        weights = None
        if need_weights:  # the math path, so the returned weights are the ones used
            weights = attention_weights(q, k, mask, causal, scale)  # (B, H, T, S)
            out = (dropout(weights, dropout_p) if dropout_p > 0.0 else weights) @ v  # (B, H, T, Dh)
        else:
            out = KERNELS[self.kernel_name](q, k, v, mask, dropout_p, causal, scale)  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, self.d_model)  # (B, T, D)
        return AttentionOutput(self.out_proj(out), weights, cache)

    def _packed_self_attention(self, query: Tensor, packing: Packing, attention_mask: Tensor | None,
                               attn_mask: Tensor | None, need_weights: bool) -> AttentionOutput:
        """``forward`` on packed rows: project the N real tokens, attend in the (B, T) layout, gather, project."""
        if query.dim() != 2 or query.shape != (packing.tokens, self.d_model):
            raise LmforgeError(f"a packed query must be (real tokens={packing.tokens}, d_model={self.d_model}); got "
                               f"{tuple(query.shape)}")
        q, k, v = (self._split_heads(packing.unpack(x))  # (B, H, T, Dh) each, zeros at padding
                   for x in self._project_qkv(query))
        if self.rotary is not None:
            q, k = self.rotary(q, 0), self.rotary(k, 0)
        mask = combine_masks(padding_to_key_mask(packing.key_mask if attention_mask is None else attention_mask),
                             attn_mask)  # (B, 1|H, 1|T, T)
        dropout_p = self.dropout if self.training else 0.0
        scale = self.d_head**-0.5
        weights = None
        if need_weights:
            weights = attention_weights(q, k, mask, False, scale)  # (B, H, T, T)
            out = (dropout(weights, dropout_p) if dropout_p > 0.0 else weights) @ v
        else:
            out = KERNELS[self.kernel_name](q, k, v, mask, dropout_p, False, scale)  # (B, H, T, Dh)
        out = packing.pack(out.transpose(1, 2))  # (N, H, Dh): the real queries only
        return AttentionOutput(self.out_proj(out.reshape(packing.tokens, self.d_model)), weights, None)

    def attend_rows(self, h: Tensor, rows: ReadRows, *, attention_mask: Tensor | None = None,
                    packing: Packing | None = None) -> Tensor:
        """Self-attention output at the rows of ``rows`` alone: their queries attend to every position's keys and
        values, as in ``forward`` (an encoder's last layer read only at those rows).

        Args:
            h: (B, T, D) the attention input at every position, or its packed (N, D) rows under ``packing``.
            rows: the rows to compute (``ReadRows.build`` with the same ``packing``).
            attention_mask: (B, T) 1 = real key (without ``packing``; under it the packing's mask).
            packing: ``h`` is packed: keys and values are projected on the real tokens only.

        Returns:
            (R, D) the output projection at the rows, in ``rows``' order.
        """
        R = rows.rows
        q = self.q_proj(rows.take(h)).view(R, self.n_heads, self.d_head)  # (R, H, Dh)
        k, v = self.k_proj(h), self.v_proj(h)  # (B, T, D) or (N, D)
        if packing is not None:
            k, v, attention_mask = packing.unpack(k), packing.unpack(v), packing.key_mask  # (B, T, D)
        k, v = self._split_heads(k), self._split_heads(v)  # (B, H, T, Dh)
        if self.rotary is not None:  # each query at its own position
            q = self.rotary(q.transpose(0, 1), positions=rows.positions).transpose(0, 1)  # (R, H, Dh)
            k = self.rotary(k, 0)
        q = rows.to_slots(q).transpose(1, 2)  # (B, H, M, Dh), zeros in the unused slots
        mask = None if attention_mask is None else padding_to_key_mask(attention_mask)  # (B, 1, 1, T)
        dropout_p = self.dropout if self.training else 0.0
        out = KERNELS[self.kernel_name](q, k, v, mask, dropout_p, False, self.d_head**-0.5)  # (B, H, M, Dh)
        out = rows.from_slots(out.transpose(1, 2))  # (R, H, Dh)
        return self.out_proj(out.reshape(R, self.d_model))  # (R, D)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_kv={self.d_kv}, dropout={self.dropout}, "
                f"kernel={self.kernel_name!r}")
