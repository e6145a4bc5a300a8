"""Relative positional attention: Transformer-XL (Dai et al. 2019) and XLNet's two-stream form (Yang et al. 2019).

Shape legend: B batch, T query (content stream) length, M memory length, K = M + T key length, R number of relative
positions (K + T bidirectional, K + 1 unidirectional), N predicted positions of the query stream (with a
``target_mapping``), H heads, Dh head dim, D model dim.

Positions are relative: the score of query i against key j depends on their distance ``M + i - j`` (the query's
absolute position minus the key's; the memory occupies positions 0 .. M - 1, the current segment M .. K - 1) through
sinusoidal encodings R of the distances, never on absolute positions.

Masks follow ``lmforge.nn.masks``: bool, True = may attend. Fully masked query rows get zero weights (never NaN).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError
from lmforge.nn.kernels.packed_dropout import dropout
from lmforge.nn.scores import masked_softmax

__all__ = ["RelativeAttentionOutput", "RelativeMultiHeadAttention", "rel_shift", "relative_positions_encoding"]


def relative_positions_encoding(
    q_len: int,
    k_len: int,
    d_model: int,
    *,
    bidirectional: bool,
    clamp_len: int | None = None,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The sinusoidal encodings R of relative distances, one row per distance, largest distance first.

    Row c encodes the distance ``k_len - c``: distances ``k_len, k_len - 1, .., 1 - q_len`` (R = k_len + q_len rows)
    when ``bidirectional`` (XLNet's attn_type "bi"; a query may look at later keys), ``k_len .. 0`` (R = k_len + 1
    rows) when not (Transformer-XL, XLNet's "uni"; causal). The row for distance p is
    ``[sin(p * f_0), .., sin(p * f_{D/2-1}), cos(p * f_0), .., cos(p * f_{D/2-1})]`` with ``f_i = base^(-2i / D)``:
    all sines, then all cosines (the two papers' and XLNet's order, not the interleaved one of Vaswani et al.).

    Args:
        q_len: T, number of queries.
        k_len: K, number of keys (memory plus queries).
        d_model: D, must be even.
        bidirectional: see above.
        clamp_len: distances beyond +-clamp_len use the encoding of +-clamp_len; None = no clamping.
        base: wavelength base (10000 in the papers).
        dtype: of the result (computed in float64).
        device: where to build it.

    Returns:
        (R, D) encodings; ``rel_shift`` maps scores against them to key positions.
    """
    if d_model <= 0 or d_model % 2:
        raise LmforgeError(f"relative position encodings need an even d_model > 0; got {d_model}")
    if q_len <= 0 or k_len < q_len:
        raise LmforgeError(
            f"relative position encodings need 0 < q_len <= k_len (keys are memory plus queries); got q_len={q_len}, "
            f"k_len={k_len}")
    if clamp_len is not None and clamp_len <= 0:
        raise LmforgeError(f"clamp_len must be a positive distance, or None for no clamping; got {clamp_len}")
    end = -q_len if bidirectional else -1
    pos = torch.arange(k_len, end, -1, dtype=torch.float64, device=device)  # (R,) k_len down to end + 1
    if clamp_len is not None:
        pos = pos.clamp(-clamp_len, clamp_len)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=device) / d_model)  # (D/2,)
    angle = pos[:, None] * inv_freq  # (R, D/2)
    return torch.cat((torch.sin(angle), torch.cos(angle)), dim=-1).to(dtype)  # (R, D)


def rel_shift(x: Tensor, k_len: int) -> Tensor:
    """Turn scores against relative-encoding rows into scores against keys (Dai et al. 2019, appendix B).

    With T = ``x.shape[-2]`` queries, the result is ``y[..., i, j] = x[..., i, T - i + j]``: query i (absolute
    position M + i, M = k_len - T) and key j are ``M + i - j`` apart, which is row ``T - i + j`` of the encodings of
    ``relative_positions_encoding`` (row c is distance k_len - c). Computed by the paper's trick, no gather: view the
    (T, R) block of each head as (R, T), drop its first T entries, view the rest as (T, R - 1) and keep the first
    k_len columns; O(T * R) memory.

    Where ``T - i + j >= R`` (only with the R = k_len + 1 unidirectional encodings, for keys after the query,
    j > M + i) the entry is a score from the next query's row, meaningless: a causal mask must hide those keys.

    Args:
        x: (..., T, R) scores, e.g. (B, H, T, R), with R > k_len (XLNet's ``rel_shift_bnij`` layout).
        k_len: K, number of keys.

    Returns:
        (..., T, K) scores indexed by key position.
    """
    *lead, T, R = x.shape
    if R <= k_len:
        raise LmforgeError(f"rel_shift needs more relative positions than keys; got R={R}, k_len={k_len}")
    y = x.reshape(*lead, R, T)[..., 1:, :]  # (..., R - 1, T): drops the first T entries of each block
    return y.reshape(*lead, T, R - 1)[..., :k_len]  # (..., T, K)


def _one_hot_rows(target_mapping: Tensor) -> tuple[Tensor, Tensor] | None:
    """(position (B, N), real (B, N) 0/1) when every row of ``target_mapping`` is one-hot or all zero (a padding
    row), as the data plans make it; None for a row that mixes positions (then the query stream runs at all T)."""
    top, pos = target_mapping.max(dim=-1)  # (B, N)
    total = target_mapping.sum(dim=-1)
    if not bool((((top == 1) & (total == 1)) | ((top == 0) & (total == 0))).all()):
        return None
    return pos, total


class RelativeAttentionOutput(NamedTuple):
    """What ``RelativeMultiHeadAttention`` returns.

    Attributes:
        output_h: (B, T, D) content stream.
        output_g: (B, N, D) query stream (N = T without a target_mapping), or None without ``g``.
        weights_h: (B, H, T, K) content-stream attention probabilities with ``need_weights=True``, else None.
            Taken before attention dropout.
        weights_g: (B, H, T, K) query-stream probabilities (at the T positions, also with a target_mapping), or None.
    """

    output_h: Tensor
    output_g: Tensor | None = None
    weights_h: Tensor | None = None
    weights_g: Tensor | None = None


class RelativeMultiHeadAttention(nn.Module):
    """Multi-head attention with relative positions, memory and XLNet's two streams, plus its residual LayerNorm.

    score(i, j) = [(q_i + u) . k_j + (q_i + v) . W_r R_{M+i-j} + (q_i + s) . e_{s_ij}] / sqrt(Dh), with
    q = h W_q, k = [SG(mems); h] W_k (Dai et al. 2019, section 3.3; the segment term is Yang et al. 2019, section
    2.5: e_0 / e_1 for a pair in the same / different segments). Then masked softmax, attention dropout, the weighted
    values, and XLNet's post-attention: output projection, dropout, residual, LayerNorm.

    ``norm_first=True`` is the pre-LN form (Transformer-XL's ``pre_lnorm``): the same LayerNorm is applied to the
    queries' stream and to every key/value position, memory included (``LN([SG(mems); h])``: the memory stays the
    layer's raw input), and the output is ``x + Dropout(o)`` with no LayerNorm after.

    Two-stream attention (Yang et al. 2019, section 2.3): the query stream ``g`` has its own queries (g W_q) but
    attends the SAME keys, values and positions as the content stream ``h``; the two differ by their masks, which
    the caller builds from the factorisation order (the content stream may see its own position, the query stream
    may not).

    Parameters, with XLNet's names and shapes so that a Hugging Face ``XLNetRelativeAttention`` state dict loads
    as it is (no reshape, no rename): ``q``, ``k``, ``v``, ``o``, ``r`` are raw (D, H, Dh) tensors, ``r_w_bias``
    (u), ``r_r_bias`` (v) and, with ``segments``, ``r_s_bias`` (s) are (H, Dh), ``seg_embed`` is (2, H, Dh),
    ``layer_norm`` is the LayerNorm. No projection bias (as in both papers). Initialised N(0, 0.02) as XLNet.
    Biases are per module; sharing them across layers (Transformer-XL, XLNet with untie_r=False) is the model's
    business.

    The memory is detached here (the paper's stop-gradient SG): no gradient ever reaches ``mems``, whatever the
    caller passes.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        *,
        dropout: float = 0.0,
        attn_dropout: float | None = None,
        segments: bool = False,
        layer_norm_eps: float = 1e-12,
        norm_first: bool = False,
    ) -> None:
        """
        Args:
            d_model: D.
            n_heads: H.
            d_head: Dh, default D / H (then H must divide D).
            dropout: on the projected output before the residual (XLNet's ``dropout``).
            attn_dropout: on the attention weights; default ``dropout`` (XLNet uses one rate for both).
            segments: add XLNet's relative segment term (``r_s_bias``, ``seg_embed``; forward takes ``seg_mat``).
            layer_norm_eps: epsilon of the LayerNorm (XLNet: 1e-12).
            norm_first: pre-LN (LayerNorm on the attention's inputs, none on its output) instead of post-LN.
        """
        super().__init__()
        if d_head is None:
            if n_heads <= 0 or d_model <= 0 or d_model % n_heads:
                raise LmforgeError(
                    f"d_model={d_model} must be a positive multiple of n_heads={n_heads} (or pass d_head)")
            d_head = d_model // n_heads
        if min(d_model, n_heads, d_head) <= 0:
            raise LmforgeError(f"d_model, n_heads, d_head must be positive; got {d_model}, {n_heads}, {d_head}")
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        for name, p in (("dropout", dropout), ("attn_dropout", attn_dropout)):
            if not 0.0 <= p < 1.0:
                raise LmforgeError(f"{name} must be in [0, 1); got {p}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_head
        self.dropout, self.attn_dropout, self.segments = dropout, attn_dropout, segments
        self.norm_first = norm_first
        shape = (d_model, n_heads, d_head)
        self.q = nn.Parameter(torch.empty(shape))  # W_q
        self.k = nn.Parameter(torch.empty(shape))  # W_k (content keys)
        self.v = nn.Parameter(torch.empty(shape))  # W_v
        self.o = nn.Parameter(torch.empty(shape))  # W_o, used as (H * Dh) -> D
        self.r = nn.Parameter(torch.empty(shape))  # W_r (position keys)
        self.r_w_bias = nn.Parameter(torch.empty(n_heads, d_head))  # u, content bias
        self.r_r_bias = nn.Parameter(torch.empty(n_heads, d_head))  # v, position bias
        if segments:
            self.r_s_bias = nn.Parameter(torch.empty(n_heads, d_head))  # s, segment bias
            self.seg_embed = nn.Parameter(torch.empty(2, n_heads, d_head))  # e_0 same, e_1 different segment
        for p in self.parameters():  # all of the above; the LayerNorm keeps ones and zeros
            nn.init.normal_(p, std=0.02)
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)

    # ----------------------------------------------------------------------------------------------------------

    def _check(self, name: str, x: Tensor, want: tuple[int | None, ...], what: str, **sizes: int) -> None:
        """``what`` is formatted with ``sizes`` only on failure (formatting a size into a string while
        ``torch.compile`` traces would specialise the graph on it)."""
        if x.dim() != len(want) or any(w is not None and w != s for w, s in zip(want, x.shape, strict=True)):
            raise LmforgeError(f"{name} must be {what.format(**sizes)}; got shape {tuple(x.shape)}")

    def _check_mask(self, name: str, mask: Tensor | None, B: int, T: int, K: int) -> Tensor | None:
        if mask is None:
            return None
        if mask.dtype != torch.bool:
            raise LmforgeError(f"{name} must be bool (True = may attend); got dtype {mask.dtype}")
        if mask.dim() != 3 or mask.shape[0] not in (1, B) or tuple(mask.shape[1:]) != (T, K):
            raise LmforgeError(
                f"{name} must be (batch={B} or 1, queries={T}, keys=memory+queries={K}) with True = may attend; "
                f"got shape {tuple(mask.shape)}")
        return mask[:, None]  # (B|1, 1, T, K)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, k_r: Tensor, seg: Tensor | None, allowed: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        # q (B, H, T, Dh); k, v (B, H, K, Dh); k_r (B|1, H, R, Dh); seg (B|1, 1, T, K) bool; allowed (B|1, 1, T, K).
        K = k.shape[-2]
        scores = (q + self.r_w_bias[:, None]) @ k.transpose(-2, -1)  # (B, H, T, K) content
        scores = scores + rel_shift((q + self.r_r_bias[:, None]) @ k_r.transpose(-2, -1), K)  # position
        if seg is not None:
            e = (q + self.r_s_bias[:, None]) @ self.seg_embed.permute(1, 2, 0)  # (B, H, T, 2)
            scores = scores + torch.where(seg, e[..., 1:], e[..., :1])  # (B, H, T, K) segment
        weights = masked_softmax(scores * self.d_head**-0.5, allowed)  # (B, H, T, K)
        dropped = dropout(weights, self.attn_dropout, self.training)
        return dropped @ v, weights  # (B, H, T, Dh), (B, H, T, K)

    def _attend_rows(
        self, q: Tensor, k: Tensor, v: Tensor, k_r: Tensor, seg: Tensor | None, allowed: Tensor | None, pos: Tensor,
        T: int,
    ) -> Tensor:
        """``_attend`` for N queries each at ONE position ``pos`` (B, N) of the T: the query stream on its predicted
        positions only (XLNet computes it at all T and keeps N). Query n at position t scores key j against the
        encoding row ``T - t + j`` (``rel_shift``'s row), read with a gather; its segment and mask rows are the
        position's rows. Same values as ``_attend`` at those positions; O(N K) instead of O(T K).

        q (B, H, N, Dh); k, v (B, H, K, Dh); k_r (B|1, H, R, Dh); seg, allowed (B|1, 1, T, K); returns (B, H, N, Dh).
        """
        B, H, N, _ = q.shape
        K, R = k.shape[-2], k_r.shape[-2]
        scores = (q + self.r_w_bias[:, None]) @ k.transpose(-2, -1)  # (B, H, N, K) content
        by_row = (q + self.r_r_bias[:, None]) @ k_r.transpose(-2, -1)  # (B, H, N, R)
        index = ((T - pos)[:, :, None] + torch.arange(K, device=q.device)).clamp(max=R - 1)  # (B, N, K); > R - 1:
        scores = scores + by_row.gather(-1, index[:, None].expand(B, H, N, K))  # causal keys, masked anyway

        def rows(x: Tensor) -> Tensor:  # (B|1, 1, T, K) -> (B, 1, N, K): each query's position's row
            return x.expand(B, 1, T, K).gather(2, pos[:, None, :, None].expand(B, 1, N, K))

        if seg is not None:
            e = (q + self.r_s_bias[:, None]) @ self.seg_embed.permute(1, 2, 0)  # (B, H, N, 2)
            scores = scores + torch.where(rows(seg), e[..., 1:], e[..., :1])
        weights = masked_softmax(scores * self.d_head**-0.5, None if allowed is None else rows(allowed))
        return dropout(weights, self.attn_dropout, self.training) @ v  # (B, H, N, Dh)

    def _post(self, x: Tensor, vec: Tensor) -> Tensor:
        # vec (B, H, L, Dh) -> projected, dropout, residual x (B, L, D), LayerNorm (post-LN only).
        out = torch.einsum("bhle,dhe->bld", vec, self.o)  # (B, L, D)
        out = dropout(out, self.dropout, self.training) + x
        return out if self.norm_first else self.layer_norm(out)

    def forward(
        self,
        h: Tensor,
        r: Tensor,
        *,
        mems: Tensor | None = None,
        attn_mask: Tensor | None = None,
        seg_mat: Tensor | None = None,
        g: Tensor | None = None,
        attn_mask_g: Tensor | None = None,
        target_mapping: Tensor | None = None,
        need_weights: bool = False,
    ) -> RelativeAttentionOutput:
        """Attend from the content stream ``h`` (and the query stream ``g``) to ``[mems; h]``.

        Args:
            h: (B, T, D) content stream.
            r: (R, D) relative encodings from ``relative_positions_encoding(T, K, D, ...)``, R = K + T
                (bidirectional) or K + 1 (unidirectional: every key after its query must then be masked), or
                (B | 1, R, D) for encodings that differ by row (XLNet's bi_data).
            mems: (B, M, D) memory: earlier hidden states prepended to the keys and values, detached here.
            attn_mask: (B | 1, T, K) bool, True = content query i may attend key j (keys: memory then h).
            seg_mat: (B | 1, T, K) bool or 0/1 integer, True / 1 = query i and key j are in different segments;
                needs ``segments=True``.
            g: (B, N, D) query stream; N = T unless ``target_mapping`` is given.
            attn_mask_g: (B | 1, T, K) bool mask of the query stream, True = may attend; needs ``g``.
            target_mapping: (B, N, T) float, row n one-hot (or a mix) over the T positions: the query stream's n-th
                prediction is made at those positions (queries mapped in, outputs mapped back, as XLNet).
            need_weights: also return the attention probabilities.

        Returns:
            RelativeAttentionOutput(output_h (B, T, D), output_g (B, N, D) or None, weights_h, weights_g).
        """
        D = self.d_model
        self._check("h", h, (None, None, D), "(batch, length, d_model={D})", D=D)
        B, T, _ = h.shape
        if mems is not None:
            self._check("mems", mems, (B, None, D), "(batch={B}, memory length, d_model={D})", B=B, D=D)
            cat = torch.cat((mems.detach(), h), dim=1)  # (B, K, D); stop-gradient on the memory
        else:
            cat = h
        K = cat.shape[1]
        if r.dim() == 2:
            r = r[None]  # (1, R, D)
        if r.dim() != 3 or r.shape[0] not in (1, B) or r.shape[-1] != D or r.shape[1] not in (K + T, K + 1):
            raise LmforgeError(
                f"r must be (R, d_model={D}) or (batch={B} or 1, R, d_model) with R = keys + queries = {K + T} "
                f"(bidirectional) or keys + 1 = {K + 1} (unidirectional); got shape {tuple(r.shape)}")
        allowed_h = self._check_mask("attn_mask", attn_mask, B, T, K)
        seg = None
        if seg_mat is not None:
            if not self.segments:
                raise LmforgeError("seg_mat needs the segment term: build the module with segments=True")
            if seg_mat.is_floating_point() or seg_mat.is_complex() or seg_mat.dim() != 3 \
                    or seg_mat.shape[0] not in (1, B) or tuple(seg_mat.shape[1:]) != (T, K):
                raise LmforgeError(
                    f"seg_mat must be bool or integer (batch={B} or 1, queries={T}, keys={K}), True / 1 = different "
                    f"segments; got shape {tuple(seg_mat.shape)}, dtype {seg_mat.dtype}")
            seg = (seg_mat != 0)[:, None]  # (B|1, 1, T, K)
        if g is None and (target_mapping is not None or attn_mask_g is not None):
            raise LmforgeError("target_mapping and attn_mask_g belong to the query stream: pass g as well")

        def heads(x: Tensor, w: Tensor) -> Tensor:
            return torch.einsum("bld,dhe->bhle", x, w)  # (B, L, D) -> (B, H, L, Dh)

        q_in = h
        if self.norm_first:  # pre-LN: the LayerNorm on every key/value position (token-wise), the queries among them
            cat = self.layer_norm(cat)  # (B, K, D)
            q_in = cat[:, K - T:]  # (B, T, D) LN(h)
        k, v = heads(cat, self.k), heads(cat, self.v)  # (B, H, K, Dh)
        k_r = heads(r.to(h.dtype), self.r)  # (B|1, H, R, Dh)
        vec_h, weights_h = self._attend(heads(q_in, self.q), k, v, k_r, seg, allowed_h)
        output_h = self._post(h, vec_h)  # (B, T, D)
        output_g = weights_g = None
        if g is not None:
            if target_mapping is None:
                self._check("g", g, (B, T, D), "(batch={B}, length={T}, d_model={D}) without a target_mapping", B=B,
                            T=T, D=D)
            else:
                self._check("target_mapping", target_mapping, (B, None, T), "(batch={B}, predictions, length={T})", B=B,
                            T=T)
                N = target_mapping.shape[1]
                self._check("g", g, (B, N, D), "(batch={B}, predictions={N}, d_model={D}) like target_mapping", B=B,
                            N=N, D=D)
            allowed_g = self._check_mask("attn_mask_g", attn_mask_g, B, T, K)
            q_g = heads(self.layer_norm(g) if self.norm_first else g, self.q)  # (B, H, N, Dh)
            one_hot = None if target_mapping is None or need_weights else _one_hot_rows(target_mapping)
            if one_hot is not None:  # each prediction at one position (or a padding row): N queries, not T
                pos, real = one_hot
                vec_g = self._attend_rows(q_g, k, v, k_r, seg, allowed_g, pos, T)
                output_g = self._post(g, vec_g * real[:, None, :, None].to(vec_g.dtype))  # padding rows: no context
                return RelativeAttentionOutput(output_h, output_g, weights_h if need_weights else None, None)
            if target_mapping is not None:
                q_g = torch.einsum("bhne,bnt->bhte", q_g, target_mapping.to(q_g.dtype))  # (B, H, T, Dh)
            vec_g, weights_g = self._attend(q_g, k, v, k_r, seg, allowed_g)  # (B, H, T, Dh)
            if target_mapping is not None:
                vec_g = torch.einsum("bhte,bnt->bhne", vec_g, target_mapping.to(vec_g.dtype))  # (B, H, N, Dh)
            output_g = self._post(g, vec_g)  # (B, N, D)
        if not need_weights:
            weights_h = weights_g = None
        return RelativeAttentionOutput(output_h, output_g, weights_h, weights_g)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, d_head={self.d_head}, dropout={self.dropout}, "
                f"attn_dropout={self.attn_dropout}, segments={self.segments}, norm_first={self.norm_first}")
