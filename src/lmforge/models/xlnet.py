"""XLNet: a permutation language model with Transformer-XL's relative positions and memory (Yang et al. 2019).

Shape legend: B batch, T current segment length, M memory length (0 without ``mems``), K = M + T key length,
N predicted positions (query stream, from ``target_mapping``), L layers, H heads, Dh head dim, D model dim, V vocab.

The forward pass, top to bottom:
    h = Dropout(WordEmbedding(ids))                                        (B, T, D)  content stream
    g = Dropout(mask_emb)  expanded to one vector per prediction           (B, N, D)  query stream (target_mapping)
    R = Dropout(sinusoids of the relative distances M + i - j)             (R, D)
    for l = 1..L:
        h, g = RelativeAttention_l(h, g; keys and values [SG(mem_l); h])   two streams, one set of weights
        h, g = FeedForward_l(h), FeedForward_l(g)                          Linear, act, drop, Linear, drop, +res, LN
                                                                           (``config.bias=False``: Linears w/o bias)
    h, g = FinalNorm(h), FinalNorm(g)                                      (pre-LN only)
    last_hidden_state = Dropout(h), query_state = Dropout(g)
    logits = state W^T + b      (XLNetLMHead, ``lm_logits``)               (B, N or T, V)
                                (W = W_E tied, XLNet's; ``tie_embeddings=False``: ``lm_head.weight`` of its own)
                                (inside forward with ``return_logits``, so DistributedDataParallel sees the head)

Pre-LN (``config.norm_first``; XLNet and the paper are post-LN): each sublayer is ``x + Dropout(sublayer(LN(x)))``
with the LayerNorm on the attention's queries and on every key/value position (``LN([SG(mem_l); h])``, as
Transformer-XL's ``pre_lnorm``), both streams through the same LayerNorms, and one final LayerNorm on both streams.
The memory of layer l is still its raw input (never normalised, never the final norm's output).

Masks. ``attention_mask`` (B, T): 1 = real token, 0 = padding. ``perm_mask`` (B, T, T) bool in the convention of
``lmforge.data.permutation``: ``perm_mask[b, i, j]`` True = position i may NOT see position j, the QUERY stream's
mask (its diagonal is True for every predicted position). From them the model builds, as XLNet does:
    blocked(i, j) = causal(i, j) ["uni" only] or padding(j) or perm_mask(i, j)   over the K keys (memory: never)
    query stream:   may attend j where not blocked(i, j)
    content stream: the same, and always its own position M + i (the diagonal is cleared)
Without any of the three (``attn_type="bi"``, no padding, no perm_mask) every position sees every key.

Segments. ``token_type_ids`` (B, T) any integers: only equality matters (relative segment encodings); memory
positions count as segment 0.

Memory. With ``use_mems=True`` the output carries, per layer, the last ``config.mem_len`` inputs of that layer
(the memory given, then this segment's; all of them when ``mem_len`` is None), detached: pass them as ``mems`` with
the next segment. No gradient ever flows into a memory. ``mems_mask`` (B, M) hides padding positions of the memory
(batched generation with left-padded prompts); without it the whole memory is visible, as in XLNet.

Fine-tuning. ``pooled_output`` (B, D) is the content state at each row's last real token (XLNet's "last" sequence
summary; lmforge's tokenizer pads on the right, so "last" is read from ``attention_mask``), with no projection: the
sequence head's dropout + linear sits on it. (Hugging Face's XLNetForSequenceClassification puts a summary
projection + tanh in its head; that head is not converted.)

Generation. ``forward_lm`` runs the model left to right in the natural factorisation order and returns the states
that predict each next token plus a memory that grows with every token (see its docstring: XLNet's dummy-token
trick through ``perm_mask`` and ``target_mapping``, with a causal context so that the memory is exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.models import PretrainedMixin
from lmforge.models.outputs import XLNetLMOutput, XLNetOutput
from lmforge.nn.feedforward import ACTIVATIONS
from lmforge.nn.init import normal_init
from lmforge.nn.inputs import check_flag, check_input_ids
from lmforge.nn.kernels.packed_dropout import Dropout
from lmforge.nn.masks import key_padding_mask
from lmforge.nn.relative import RelativeMultiHeadAttention, relative_positions_encoding

__all__ = ["XLNet", "XLNetFeedForward", "XLNetLMHead", "XLNetLMOutput", "XLNetLayer", "XLNetOutput"]


class XLNetFeedForward(nn.Module):
    """XLNet's position-wise feed-forward with its residual and LayerNorm:
    ``LayerNorm(x + Dropout(layer_2(Dropout(act(layer_1(x))))))``, or with ``norm_first`` (pre-LN)
    ``x + Dropout(layer_2(Dropout(act(layer_1(LayerNorm(x))))))``.

    Parameter names as XLNet's (``layer_1``, ``layer_2``, ``layer_norm``); ``bias=False``: the two Linears have
    no bias (Cramming's option; the LayerNorm keeps its own).
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "gelu", dropout: float = 0.0,
                 layer_norm_eps: float = 1e-12, norm_first: bool = False, bias: bool = True) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise LmforgeError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.layer_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.layer_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = Dropout(dropout)
        self.activation = ACTIVATIONS[activation]
        self.norm_first = norm_first

    def forward(self, x: Tensor) -> Tensor:
        y = self.dropout(self.activation(self.layer_1(self.layer_norm(x) if self.norm_first else x)))
        y = x + self.dropout(self.layer_2(y))
        return y if self.norm_first else self.layer_norm(y)


class XLNetLayer(nn.Module):
    """One XLNet layer: two-stream relative attention (``rel_attn``), then the feed-forward (``ff``) applied to
    each stream with the same weights."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.d_ff is not None
        self.rel_attn = RelativeMultiHeadAttention(
            config.d_model, config.n_heads, dropout=config.dropout, attn_dropout=config.attention_dropout,
            segments=True, layer_norm_eps=config.layer_norm_eps, norm_first=config.norm_first)
        self.ff = XLNetFeedForward(config.d_model, config.d_ff, activation=config.activation, dropout=config.dropout,
                                   layer_norm_eps=config.layer_norm_eps, norm_first=config.norm_first,
                                   bias=config.bias)

    def forward(self, h: Tensor, g: Tensor | None, r: Tensor, *, mems: Tensor | None, allowed_h: Tensor | None,
                allowed_g: Tensor | None, seg_mat: Tensor | None, target_mapping: Tensor | None,
                need_weights: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
        out = self.rel_attn(h, r, mems=mems, attn_mask=allowed_h, seg_mat=seg_mat, g=g, attn_mask_g=allowed_g,
                            target_mapping=target_mapping, need_weights=need_weights)
        g_out = None if out.output_g is None else self.ff(out.output_g)
        return self.ff(out.output_h), g_out, out.weights_h


class XLNetLMHead(nn.Module):
    """XLNet's LM head (``lm_loss``): ``hidden W^T + bias``, W the word embedding (tied, as XLNet; not held here),
    or with ``tied=False`` a (V, D) ``weight`` of its own (saved as ``lm_head.weight``; the model draws it from
    N(0, init_std)), so that the input embeddings learn only from the contexts their tokens appear in."""

    def __init__(self, vocab_size: int, d_model: int | None = None, *, tied: bool = True) -> None:
        super().__init__()
        if not tied and d_model is None:
            raise LmforgeError("an untied XLNetLMHead needs d_model, the width of its (vocab_size, d_model) weight")
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.weight: nn.Parameter | None = None if tied else nn.Parameter(torch.empty(vocab_size, d_model))

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        """(..., D) states, the (V, D) word embedding (used when tied) -> (..., V) scores."""
        return F.linear(hidden, embedding if self.weight is None else self.weight, self.bias)


class XLNet(PretrainedMixin, nn.Module):
    """XLNet: Yang et al. 2019, "XLNet: Generalized Autoregressive Pretraining for Language Understanding", on
    Transformer-XL (Dai et al. 2019): relative positions, segment-level memory, two-stream attention.

    ``config.attn_type``: "bi" (XLNet: which positions see which is decided by ``perm_mask``) or "uni" (causal, as
    Transformer-XL; ``same_length`` gives every query the same number of keys). ``config.clamp_len`` clamps the
    relative distances; ``config.mem_len`` is the memory kept per layer. One dropout rate acts on the embeddings,
    the relative encodings, the residual branches and the output (``config.dropout``); ``attention_dropout`` on the
    attention weights (XLNet uses one rate for both).

    Initialisation as XLNet: every weight (embedding, linear, relative-attention tensors and biases, ``mask_emb``,
    an untied LM head's) N(0, init_std), linear biases and the LM bias 0, LayerNorms (1, 0).

    State-dict keys (XLNet's names, so that a Hugging Face checkpoint converts by renaming only):
    ``word_embedding.weight``, ``mask_emb`` (1, 1, D), ``layers.{l}.rel_attn.{q,k,v,o,r}`` (D, H, Dh),
    ``layers.{l}.rel_attn.{r_w_bias,r_r_bias,r_s_bias}`` (H, Dh), ``layers.{l}.rel_attn.seg_embed`` (2, H, Dh),
    ``layers.{l}.rel_attn.layer_norm.*``, ``layers.{l}.ff.{layer_1,layer_2,layer_norm}.*`` (no Linear biases with
    ``bias=False``), ``final_norm.*`` (pre-LN only), ``lm_head.bias`` (V,), ``lm_head.weight`` (V, D) (untied only).
    """

    def __init__(self, config: ModelConfig) -> None:
        """
        Args:
            config: a ``ModelConfig`` with ``arch="xlnet"`` (e.g. the ``xlnet-tiny`` .. ``xlnet-large`` presets).
        """
        super().__init__()
        if config.arch != "xlnet":
            raise LmforgeError(f"XLNet needs a config with arch='xlnet'; got arch={config.arch!r}")
        self.config = config
        D = config.d_model
        self.word_embedding = nn.Embedding(config.vocab_size, D)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, D))  # the query stream's input: the trainable vector w
        self.layers = nn.ModuleList(XLNetLayer(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(D, eps=config.layer_norm_eps) if config.norm_first else None
        self.dropout = Dropout(config.dropout)
        self.lm_head = XLNetLMHead(config.vocab_size, D, tied=config.tie_embeddings)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """XLNet's initialisation (see the class docstring)."""
        std = self.config.init_std
        for module in self.modules():
            normal_init(module, std)
            if isinstance(module, RelativeMultiHeadAttention):
                for p in module.parameters(recurse=False):
                    nn.init.normal_(p, std=std)
        nn.init.normal_(self.mask_emb, std=std)
        nn.init.zeros_(self.lm_head.bias)
        if self.lm_head.weight is not None:
            nn.init.normal_(self.lm_head.weight, std=std)

    def lm_logits(self, hidden: Tensor) -> Tensor:
        """Vocabulary scores of states of either stream (XLNet's ``lm_loss``: tied to the word embedding, or
        ``lm_head.weight`` with ``tie_embeddings=False``).

        Args:
            hidden: (..., D), e.g. ``query_state`` (B, N, D) or ``last_hidden_state`` (B, T, D).

        Returns:
            (..., V).
        """
        return self.lm_head(hidden, self.word_embedding.weight)

    # ----------------------------------------------------------------------------------------------------------

    def _check_mems(self, mems: Sequence[Tensor] | None, B: int) -> int:
        if mems is None:
            return 0
        L, D = len(self.layers), self.config.d_model
        if not isinstance(mems, list | tuple) or len(mems) != L or not all(isinstance(m, Tensor) for m in mems):
            raise LmforgeError(f"mems must be a list of {L} tensors (one per layer, as returned in XLNetOutput.mems "
                               f"with use_mems=True); got {type(mems).__name__}"
                               + (f" of {len(mems)}" if isinstance(mems, list | tuple) else ""))
        M = mems[0].shape[1] if mems[0].dim() == 3 else -1
        for i, m in enumerate(mems):
            if m.dim() != 3 or m.shape[0] != B or m.shape[1] != M or m.shape[2] != D or not m.is_floating_point():
                raise LmforgeError(f"mems[{i}] must be a float (batch={B}, memory length, d_model={D}) tensor with "
                                   f"the same memory length in every layer; got shape {tuple(m.shape)}, dtype "
                                   f"{m.dtype}")
        return M

    def _masks(self, B: int, T: int, M: int, attention_mask: Tensor | None, perm_mask: Tensor | None,
               mems_mask: Tensor | None, device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """(content, query) bool masks (B | 1, T, K), True = may attend; (None, None) when nothing is masked."""
        K = M + T
        blocked = None
        if self.config.attn_type == "uni":
            blocked = torch.ones(T, K, dtype=torch.bool, device=device).triu(M + 1)  # keys after the query
            if self.config.same_length:  # also the oldest keys, so every query sees the same number of keys
                blocked[:, :T] |= torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)
            blocked = blocked[None]  # (1, T, K)
        data = None
        if attention_mask is not None:
            padding = ~key_padding_mask(attention_mask, batch=B, length=T)  # (B, T) True = padding
            data = padding[:, None, :].expand(B, T, T)
        if perm_mask is not None:
            if not isinstance(perm_mask, Tensor) or perm_mask.dim() != 3 or tuple(perm_mask.shape) != (B, T, T) \
                    or perm_mask.is_complex():
                got = tuple(perm_mask.shape) if isinstance(perm_mask, Tensor) else type(perm_mask).__name__
                raise LmforgeError(f"perm_mask must be (batch={B}, length={T}, length={T}) with True = position i may "
                                   f"NOT see position j (the query stream's mask); got {got}")
            if perm_mask.dtype != torch.bool:
                if bool(((perm_mask != 0) & (perm_mask != 1)).any()):
                    raise LmforgeError("perm_mask must be bool, or 0/1 values (1 = may not see); it holds values "
                                       "other than 0 and 1")
                perm_mask = perm_mask != 0
            data = perm_mask if data is None else data | perm_mask
        memory = None  # (B, T, M) True = a padding position of the memory
        if mems_mask is not None:
            if not M:
                raise LmforgeError("mems_mask marks the padding of the memory: pass it with mems")
            real = key_padding_mask(mems_mask, batch=B, length=M, name="mems_mask", length_label=f"memory length={M}")
            memory = (~real)[:, None, :].expand(B, T, M)
        if data is not None or memory is not None:
            if data is None:
                data = torch.zeros(B, T, T, dtype=torch.bool, device=device)
            if M:  # the memory is visible, but for its padding (mems_mask)
                data = torch.cat((memory if memory is not None else data.new_zeros(B, T, M), data), dim=2)
            blocked = data if blocked is None else blocked | data
        if blocked is None:
            return None, None
        allowed_g = ~blocked  # (B|1, T, K)
        own = torch.zeros(T, K, dtype=torch.bool, device=device)
        own[torch.arange(T, device=device), M + torch.arange(T, device=device)] = True
        return allowed_g | own, allowed_g

    def _segments(self, token_type_ids: Tensor | None, B: int, T: int, M: int) -> Tensor | None:
        if token_type_ids is None:
            return None
        if not isinstance(token_type_ids, Tensor) or tuple(token_type_ids.shape) != (B, T) \
                or token_type_ids.is_floating_point() or token_type_ids.is_complex():
            got = (f"shape {tuple(token_type_ids.shape)}, dtype {token_type_ids.dtype}"
                   if isinstance(token_type_ids, Tensor) else type(token_type_ids).__name__)
            raise LmforgeError(f"token_type_ids must be an integer (batch={B}, length={T}) tensor of segment ids; "
                               f"got {got}")
        keys = torch.cat((token_type_ids.new_zeros(B, M), token_type_ids), dim=1)  # memory: segment 0
        return token_type_ids[:, :, None] != keys[:, None, :]  # (B, T, K) True = different segments

    def _cache(self, h: Tensor, mem: Tensor | None) -> Tensor:
        new = h if mem is None else torch.cat((mem, h), dim=1)
        if self.config.mem_len is not None:
            new = new[:, -self.config.mem_len:]
        return new.detach()

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        mems: Sequence[Tensor] | None = None,
        mems_mask: Tensor | None = None,
        perm_mask: Tensor | None = None,
        target_mapping: Tensor | None = None,
        use_mems: bool = False,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        return_logits: str | None = None,
        logits_rows: Tensor | None = None,
        reversed_rows: Tensor | None = None,
    ) -> XLNetOutput:
        """Run one segment, attending to the memory too.

        Args:
            input_ids: (B, T) token ids in [0, V).
            attention_mask: (B, T) 1 = real token, 0 = padding (padding keys are hidden from every query; a padded
                query still sees itself in the content stream).
            token_type_ids: (B, T) integer segment ids (only equality matters; memory positions are segment 0).
            mems: L tensors (B, M, D), the ``mems`` of the previous segment's output (detached here anyway).
            mems_mask: (B, M) 1 = real token, 0 = padding, for the memory positions (padding keys of the memory
                are hidden from every query; without it the whole memory is visible, as in XLNet).
            perm_mask: (B, T, T) bool, True = position i may NOT see position j: the query stream's mask of
                ``lmforge.data.permutation`` (the content stream's is derived by letting each position see itself).
            target_mapping: (B, N, T) float, row n one-hot at the position of the n-th prediction: runs the query
                stream (N queries starting from ``mask_emb``).
            use_mems: return the new memory (``XLNetOutput.mems``).
            output_hidden_states: return the content stream's input to every layer and the last output (after
                the final LayerNorm with pre-LN).
            output_attentions: return the content stream's attention weights of every layer.
            return_logits: "content" or "query": also run the LM head (``lm_logits``) on that stream's final
                states, inside this forward, so that an objective calls the model once as a whole (under
                DistributedDataParallel the LM bias then takes part in the wrapped forward). "content": the
                content state at t (with ``attn_type="uni"``, Transformer-XL's prediction of token t + 1); "query":
                the query stream (needs ``target_mapping``; XLNet's permutation LM).
            logits_rows: with ``return_logits``, a bool (B, T) ("content") or (B, N) ("query") mask: the scores of
                the selected rows only, flattened in row-major order to (n, V) (the vocabulary projection then
                runs only where something is predicted, e.g. the real prediction rows of plan "plm").
            reversed_rows: (B,) bool, True on rows whose text is read reversed (XLNet's ``bi_data``): their relative
                distances are negated (sin(-d f) = -sin(d f): the sine half of their encodings changes sign), so
                they count in text order, as the original's backward position sequence.

        Returns:
            XLNetOutput(last_hidden_state (B, T, D), pooled_output (B, D), hidden_states, attentions,
            query_state (B, N, D) or None, mems, logits or None).
        """
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        need_weights = check_flag(output_attentions, "output_attentions")
        self._check_logits_request(return_logits, logits_rows, target_mapping, B, T)
        M = self._check_mems(mems, B)
        K = M + T
        device = input_ids.device
        allowed_h, allowed_g = self._masks(B, T, M, attention_mask, perm_mask, mems_mask, device)
        seg_mat = self._segments(token_type_ids, B, T, M)

        h = self.dropout(self.word_embedding(input_ids))  # (B, T, D)
        g = None
        if target_mapping is None:
            allowed_g = None  # no query stream: the content stream's mask is all that is used
        if target_mapping is not None:
            if not isinstance(target_mapping, Tensor) or target_mapping.dim() != 3 \
                    or target_mapping.shape[0] != B or target_mapping.shape[2] != T \
                    or not target_mapping.is_floating_point():
                got = (f"shape {tuple(target_mapping.shape)}, dtype {target_mapping.dtype}"
                       if isinstance(target_mapping, Tensor) else type(target_mapping).__name__)
                raise LmforgeError(f"target_mapping must be a float (batch={B}, predictions, length={T}) tensor, row n "
                                   f"one-hot at the n-th predicted position; got {got}")
            g = self.dropout(self.mask_emb.expand(B, target_mapping.shape[1], -1))  # (B, N, D)
        r = relative_positions_encoding(T, K, self.config.d_model, bidirectional=self.config.attn_type == "bi",
                                        clamp_len=self.config.clamp_len, dtype=h.dtype, device=device)
        if reversed_rows is not None:
            if not isinstance(reversed_rows, Tensor) or tuple(reversed_rows.shape) != (B,) \
                    or reversed_rows.is_floating_point() or reversed_rows.is_complex():
                got = (f"shape {tuple(reversed_rows.shape)}" if isinstance(reversed_rows, Tensor)
                       else type(reversed_rows).__name__)
                raise LmforgeError(f"reversed_rows must be a bool (batch={B},) tensor, True on the rows read reversed "
                                   f"(bi_data); got {got}")
            sign = torch.ones(self.config.d_model, dtype=r.dtype, device=device)
            sign[: self.config.d_model // 2] = -1.0  # the distance negated: sines change sign, cosines do not
            r = torch.where(reversed_rows.to(torch.bool)[:, None, None], r * sign, r)  # (B, R, D)
        r = self.dropout(r)  # (R, D), or (B, R, D) with reversed_rows

        new_mems: list[Tensor] | None = [] if use_mems else None
        hidden_states: list[Tensor] | None = [] if output_hidden_states else None
        attentions: list[Tensor] | None = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            mem = None if mems is None else mems[i]
            if new_mems is not None:
                new_mems.append(self._cache(h, mem))
            if hidden_states is not None:
                hidden_states.append(h)
            h, g, weights = layer(h, g, r, mems=mem, allowed_h=allowed_h, allowed_g=allowed_g, seg_mat=seg_mat,
                                  target_mapping=target_mapping, need_weights=need_weights)
            if attentions is not None:
                attentions.append(weights)
        if self.final_norm is not None:  # pre-LN: one closing LayerNorm for both streams, after every memory is cut
            h = self.final_norm(h)
            g = None if g is None else self.final_norm(g)
        if hidden_states is not None:
            hidden_states.append(h)
        h = self.dropout(h)
        if attention_mask is None:
            last = torch.full((B,), T - 1, device=device)
        else:  # each row's last real position (0 for a row without any)
            real = key_padding_mask(attention_mask, batch=B, length=T)
            last = torch.where(real, torch.arange(T, device=device), -1).amax(dim=1).clamp(min=0)
        pooled = h[torch.arange(B, device=device), last]  # (B, D)
        query_state = None if g is None else self.dropout(g)
        logits = None
        if return_logits is not None:
            states = h if return_logits == "content" else query_state
            assert states is not None
            logits = self.lm_logits(states if logits_rows is None else states[logits_rows.to(torch.bool)])
        return XLNetOutput(h, pooled,
                           hidden_states=None if hidden_states is None else tuple(hidden_states),
                           attentions=None if attentions is None else tuple(attentions),
                           query_state=query_state,
                           mems=None if new_mems is None else tuple(new_mems), logits=logits)

    @staticmethod
    def _check_logits_request(return_logits: str | None, logits_rows: Tensor | None,
                              target_mapping: Tensor | None, B: int, T: int) -> None:
        if return_logits not in (None, "content", "query"):
            raise LmforgeError(f"return_logits must be None, 'content' (the content stream's states) or 'query' (the "
                               f"query stream's, with target_mapping); got {return_logits!r}")
        if return_logits == "query" and target_mapping is None:
            raise LmforgeError("return_logits='query' scores the query stream, which runs only with a "
                               "target_mapping; pass one, or ask for return_logits='content'")
        if logits_rows is None:
            return
        if return_logits is None:
            raise LmforgeError("logits_rows selects rows of the logits: pass it with return_logits")
        rows = T if return_logits == "content" else (
            target_mapping.shape[1] if isinstance(target_mapping, Tensor) and target_mapping.dim() == 3 else -1)
        if not isinstance(logits_rows, Tensor) or tuple(logits_rows.shape) != (B, rows) \
                or logits_rows.is_floating_point() or logits_rows.is_complex():
            got = (f"shape {tuple(logits_rows.shape)}, dtype {logits_rows.dtype}" if isinstance(logits_rows, Tensor)
                   else type(logits_rows).__name__)
            axis = "length" if return_logits == "content" else "predictions"
            raise LmforgeError(f"logits_rows must be a bool (batch={B}, {axis}={rows}) mask of the rows to score; "
                               f"got {got}")

    def forward_lm(self, input_ids: Tensor, *, attention_mask: Tensor | None = None,
                   mems: Sequence[Tensor] | None = None, mems_mask: Tensor | None = None,
                   stream: str = "query") -> XLNetLMOutput:
        """XLNet as a left-to-right language model (what generation runs): the states that predict each next token,
        and the memory to continue from.

        The natural factorisation order (XLNet's identity permutation): token t sees the memory and tokens 0..t
        (with ``attn_type="uni"`` that is the model's own causal mask; with "bi" a ``perm_mask`` makes it so).

        ``stream="query"`` (default) is XLNet's trick for generation (Hugging Face's
        ``XLNetLMHeadModel.prepare_inputs_for_generation``), for either ``attn_type``: one dummy token is put after
        the T tokens, ``perm_mask`` hides it from every position, and ``target_mapping`` runs the query stream at
        positions 1..T, so the query at t + 1 sees the content of 0..t but not its own token: how the permutation LM
        objective predicts a token (``lmforge.objectives.plm``; with the identity order it is exactly this). The
        dummy's id is never seen. ``stream="content"``: the content state at t predicts token t + 1 (a
        Transformer-XL language model; only meaningful for a model trained that way).

        Unlike Hugging Face, which lets the prompt's tokens see each other both ways and recomputes the last two
        tokens every step (so its cached generation differs from an uncached one), the context here is causal: a
        token's state never changes once computed, and continuing from ``mems`` gives exactly what the whole
        sequence at once gives.

        The memory keeps every token (``config.mem_len``, the memory kept while training on segments, does not
        apply): generation conditions on the whole context.

        Args:
            input_ids: (B, T) token ids, the tokens after the memory.
            attention_mask: (B, T) 1 = real token, 0 = padding (generation pads on the left).
            mems: L tensors (B, M, D): the ``mems`` of a previous ``forward_lm`` call.
            mems_mask: (B, M) 1 = real token, 0 = padding, of the memory positions.
            stream: "query" or "content" (see above).

        Returns:
            XLNetLMOutput(last_hidden_state (B, T, D): row t predicts token t + 1 (``lm_logits``), mems (B, M + T, D)).
        """
        if stream not in ("query", "content"):
            raise LmforgeError(f"stream must be 'query' (XLNet's prediction, the default) or 'content' (a "
                               f"Transformer-XL LM); got {stream!r}")
        B, T = check_input_ids(input_ids, vocab_size=self.config.vocab_size)
        device = input_ids.device
        ids, perm_mask, target_mapping = input_ids, None, None
        if stream == "query":
            ids = torch.cat((input_ids, input_ids.new_full((B, 1), self.config.pad_token_id)), dim=1)  # + dummy
            if attention_mask is not None:
                real = key_padding_mask(attention_mask, batch=B, length=T)
                attention_mask = torch.cat((real, real.new_ones(B, 1)), dim=1)  # (B, T + 1)
            target_mapping = torch.zeros(B, T, T + 1, dtype=self.mask_emb.dtype, device=device)
            target_mapping[:, torch.arange(T, device=device), torch.arange(1, T + 1, device=device)] = 1.0
        if stream == "query" or self.config.attn_type == "bi":
            # natural order: position i may not see itself nor any later position (the dummy, last, is seen by none)
            n = ids.shape[1]
            perm_mask = torch.ones(n, n, dtype=torch.bool, device=device).triu()[None].expand(B, -1, -1)
        out = self.forward(ids, attention_mask=attention_mask, mems=mems, mems_mask=mems_mask, perm_mask=perm_mask,
                           target_mapping=target_mapping, output_hidden_states=True)
        states = out.last_hidden_state if out.query_state is None else out.query_state  # (B, T, D)
        assert out.hidden_states is not None
        new_mems = tuple((h[:, :T] if mems is None else torch.cat((mems[i], h[:, :T]), dim=1)).detach()
                         for i, h in enumerate(out.hidden_states[:-1]))  # each layer's input, without the dummy
        return XLNetLMOutput(states, new_mems)
