"""How each model family starts and steps during generation: one small protocol, one adapter per family.

Shape legend: B rows (inputs, or inputs x beams after a reorder), W prompt / source width, V vocab, D model dim.

The protocol (``GenerationAdapter``), used by every search in ``lmforge.generation.search``:
    prepare(input_ids, attention_mask, max_new_tokens) -> (input_ids, attention_mask, max_new_tokens)
        validate the prompts (errors a user can cause), normalise the padding, cap max_new_tokens to the context
    context(input_ids, attention_mask) -> (tokens (B, L), mask (B, L))
        what the logits processors count as already seen (the prompt of a decoder-only model; nothing for
        encoder-decoders, whose source is another text)
    start(input_ids, attention_mask, max_new_tokens) -> (logits (B, V) of the first new token, state)
    step(state, next_ids (B,)) -> (logits (B, V) of the following token, state)
    reorder(state, index (B',)) -> state
        keep rows ``index`` in that order (repeats allowed): beam selection, expanding inputs into beams or
        samples, dropping finished rows

Any object with ``start``, ``step`` and ``reorder`` is used as an adapter directly (subclass ``ModelAdapter`` for
the defaults of ``prepare`` and ``context``). ``adapter_for`` picks one for a model:
    Decoder         the prompt is ``input_ids`` (any padding layout; re-packed to left padding). With the cache: one
                    forward pass over the prompt, then one token per step, the attention mask growing by a 1 per
                    step. Without: the whole sequence again at every step.
    EncoderDecoder  ``input_ids`` is the source, encoded once; the decoder starts from ``bos_id``. With the cache:
                    self-attention keys/values grow by one step, cross-attention keys/values are projected once.
                    Without: the whole target prefix is decoded again at every step.
    AWDLSTM         a recurrent causal LM: the prompt (any padding, re-packed to the right) is read once, each row's
                    LSTM state taken after its own last token, then one token per step from that state. The state is
                    the cache, so ``use_cache`` changes nothing; no length limit.
    BiLM            ELMo's biLM: its forward (left-to-right) LM alone (``BiLM.forward_lm``), exactly as AWDLSTM;
                    the backward LM does not run. (A fine-tuned ``ELMoEncoder`` does not generate: use the biLM
                    folder it was fine-tuned from.)
    XLNet           the prompt is continued in XLNet's natural factorisation order (``XLNet.forward_lm``; each token
                    sees the tokens before it, whatever attn_type): a dummy token after the context, hidden by
                    ``perm_mask``, is predicted by the query stream through ``target_mapping`` (XLNet's generation
                    trick). Prompts are re-packed to left padding. With the cache the prompt is read once and each
                    step reads one token (and the dummy) against the memory (``mems``, whose padding ``mems_mask``
                    hides); without, the whole sequence again at every step; both give the same tokens. No length
                    limit.
    RNNSeq2Seq, or any model with ``encode(src_ids, src_mask) -> state``, ``decode_step(prev_ids, state) ->
                    (logits, state)`` and ``reorder_state(state, index) -> state``: the recurrent state is the
                    cache, so ``use_cache`` changes nothing.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from lmforge.errors import LmforgeError

__all__ = ["DecoderAdapter", "EncoderDecoderAdapter", "GenerationAdapter", "ModelAdapter", "RecurrentAdapter",
           "RecurrentLMAdapter", "XLNetAdapter", "adapter_for"]


@runtime_checkable
class GenerationAdapter(Protocol):
    """See the module docstring."""

    def prepare(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Tensor, int]:
        ...

    def context(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        ...

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Any]:
        ...

    def step(self, state: Any, next_ids: Tensor) -> tuple[Tensor, Any]:
        ...

    def reorder(self, state: Any, index: Tensor) -> Any:
        ...


class ModelAdapter:
    """Defaults of the protocol: prompts are checked for shape and emptiness, nothing limits their length, and
    the processors see no context. Subclasses implement ``start``, ``step`` and ``reorder``."""

    #: the longest input / context the model accepts (None = unlimited).
    max_length: int | None = None
    #: what the input is called in error messages.
    input_name: str = "prompt"

    def prepare(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Tensor, int]:
        check_prompts(input_ids, attention_mask, self.input_name, self.max_length)
        return input_ids, attention_mask, max_new_tokens

    def context(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        empty = input_ids.new_zeros((input_ids.shape[0], 0))
        return empty, empty

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def step(self, state: Any, next_ids: Tensor) -> tuple[Tensor, Any]:
        raise NotImplementedError

    def reorder(self, state: Any, index: Tensor) -> Any:
        raise NotImplementedError


def check_prompts(input_ids: Tensor, attention_mask: Tensor, name: str, max_length: int | None) -> None:
    """Errors a user can cause: a wrong shape, an empty prompt, a prompt longer than the model's context."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise LmforgeError(f"input_ids must be a (batch, length) tensor of token ids; got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise LmforgeError(f"input_ids must hold integer token ids; got dtype {input_ids.dtype}")
    if input_ids.shape[0] == 0:
        raise LmforgeError("input_ids has no rows; pass at least one prompt")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise LmforgeError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)} (1 = real "
                           f"token, 0 = padding); got {tuple(attention_mask.shape)}")
    lengths = (attention_mask != 0).sum(-1)  # (B,)
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        which = f"{name} {empty[0]} of the batch is" if len(empty) == 1 else \
            f"{name}s {', '.join(map(str, empty))} of the batch are"
        raise LmforgeError(f"{which} empty (no real token); give every {name} at least one token")
    longest = int(lengths.max())
    if max_length is not None and longest > max_length:
        row = int(lengths.argmax())
        raise LmforgeError(f"{name} {row} of the batch has {longest} tokens, longer than the model's context "
                           f"(max_seq_len={max_length}); shorten it")


def cap_new_tokens(max_new_tokens: int, limit: int, why: str) -> int:
    """``max_new_tokens`` capped at ``limit`` with a warning that says why."""
    if max_new_tokens <= limit:
        return max_new_tokens
    warnings.warn(f"max_new_tokens={max_new_tokens} reduced to {limit}: {why}", stacklevel=4)
    return limit


# -------------------------------------------------------------------------------------------------- decoder only
@dataclass
class _DecoderState:
    cache: Any  # DecoderCache, or None without the cache
    ids: Tensor | None  # (B, S) the whole sequence so far, without the cache
    mask: Tensor | None  # cached: (B, W + max_new_tokens) preallocated (None = no padding); else (B, S)
    length: int  # S, positions so far (padding included)


class DecoderAdapter(ModelAdapter):
    """A decoder-only ``Decoder`` (GPT): the prompt is continued (see the module docstring).

    Any padding layout is accepted and re-packed to left padding (the real tokens of a row moved to its end, in
    order): the incremental decoder appends every new token at the same column for all rows, so that is the
    layout it needs. Position ids skip the padding, so a padded row generates what it would alone.

    The scores of each step are written into one buffer the adapter keeps (a step's scores are valid until the next
    ``step``): ``generate`` makes an adapter per call; one passed in by the caller serves one generation at a time.
    """

    input_name = "prompt"

    def __init__(self, model: nn.Module, use_cache: bool = True) -> None:
        self.model = model
        self.use_cache = use_cache
        self.max_length = model.config.max_seq_len
        # only the last position is read: a model that can, computes its last layer there alone
        self._last_only = {"last_only": True} if _accepts(model.forward, "last_only") else {}
        # one (rows, V) buffer for every step's scores, where the model can write into one (the searches read a
        # step's scores before asking for the next step's, and copy what they keep)
        self._writes_into = _accepts(getattr(model, "lm_logits", None), "out")
        self._scores: Tensor | None = None

    def prepare(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Tensor, int]:
        check_prompts(input_ids, attention_mask, self.input_name, self.max_length)
        input_ids, attention_mask = left_pad(input_ids, attention_mask)
        W = input_ids.shape[1]
        # The last new token is never fed back, so W + max_new_tokens - 1 positions must fit.
        limit = self.max_length - W + 1
        max_new_tokens = cap_new_tokens(max_new_tokens, limit, f"the longest prompt has {W} tokens and the model "
                                        f"reads at most max_seq_len={self.max_length} positions")
        return input_ids, attention_mask, max_new_tokens

    def context(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        return input_ids, attention_mask

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, _DecoderState]:
        B, W = input_ids.shape
        padded = not bool(attention_mask.all())
        if not self.use_cache:
            state = _DecoderState(None, input_ids, attention_mask, W)
            return self._last_logits(input_ids, attention_mask if padded else None, None), state
        cache = self.model.new_cache()
        if hasattr(cache, "reserve"):
            cache.reserve(W + max_new_tokens)
        mask = None
        if padded:  # preallocated: every step only widens the view, no concatenation
            mask = attention_mask.new_ones((B, W + max_new_tokens))
            mask[:, :W] = attention_mask
        logits = self._last_logits(input_ids, None if mask is None else mask[:, :W], cache)
        return logits, _DecoderState(cache, None, mask, W)

    def step(self, state: _DecoderState, next_ids: Tensor) -> tuple[Tensor, _DecoderState]:
        state.length += 1
        if state.cache is None:
            assert state.ids is not None and state.mask is not None
            state.ids = torch.cat((state.ids, next_ids[:, None]), dim=1)  # (B, S)
            state.mask = torch.cat((state.mask, state.mask.new_ones((state.mask.shape[0], 1))), dim=1)
            mask = state.mask if not bool(state.mask.all()) else None
            return self._last_logits(state.ids, mask, None), state
        mask = None if state.mask is None else state.mask[:, :state.length]
        return self._last_logits(next_ids[:, None], mask, state.cache), state

    def reorder(self, state: _DecoderState, index: Tensor) -> _DecoderState:
        if state.cache is not None:
            state.cache.reorder(index)
        if state.ids is not None:
            state.ids = state.ids.index_select(0, index)
        if state.mask is not None:
            state.mask = state.mask.index_select(0, index)
        return state

    def _last_logits(self, ids: Tensor, mask: Tensor | None, cache: Any) -> Tensor:
        if getattr(self.model, "logits_in_graph", False):  # the projection runs inside the model (an ONNX graph):
            # take its logits rather than project the final states a second time (lmforge.persistence.onnx_decoder)
            return self.model(ids, attention_mask=mask, cache=cache, last_only=True).logits[:, -1]  # (B, V)
        # Only the last position's scores are needed: skip the (B, T, V) projection of the others.
        out = self.model(ids, attention_mask=mask, cache=cache, return_logits=False, **self._last_only)
        hidden = out.last_hidden_state[:, -1]  # (B, D)
        if not self._writes_into:
            return self.model.lm_logits(hidden)  # (B, V)
        self._scores = scratch_rows(self._scores, hidden.shape[0], self.model.output_weight.shape[0], hidden)
        return self.model.lm_logits(hidden, out=self._scores[:hidden.shape[0]])  # (B, V)


def scratch_rows(buffer: Tensor | None, rows: int, cols: int, like: Tensor) -> Tensor:
    """``buffer`` when its first ``rows`` rows can hold a (rows, cols) tensor of ``like``'s dtype and device, else
    a new (rows, cols) one: a decoding loop reuses one buffer across steps (rows leave, never join) instead of a
    fresh tensor per step, which glibc malloc maps afresh (its pages fault in again)."""
    if (buffer is None or buffer.shape[0] < rows or buffer.shape[1:] != (cols,) or buffer.dtype != like.dtype
            or buffer.device != like.device):
        return like.new_empty((rows, cols))
    return buffer


def _accepts(fn: Any, name: str) -> bool:
    """Whether the callable ``fn`` takes the keyword ``name`` (False for None, or where its signature cannot be
    read)."""
    if fn is None:
        return False
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def left_pad(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Move every row's real tokens (mask 1) to its end, keeping their order, and drop all-padding columns.

    Returns:
        (input_ids, attention_mask), (B, W') with W' the longest row.
    """
    real = (attention_mask != 0).long()
    order = torch.argsort(real, dim=1, stable=True)  # padding first, then the real tokens in their order
    ids, real = input_ids.gather(1, order), real.gather(1, order)
    width = int(real.sum(-1).max())
    return ids[:, ids.shape[1] - width:], real[:, real.shape[1] - width:]


# ------------------------------------------------------------------------------------------- encoder-decoder
@dataclass
class _Seq2SeqState:
    memory: Tensor  # (B, S, D)
    src_mask: Tensor | None  # (B, S), None = no padding
    cache: Any  # Seq2SeqCache, or None without the cache
    tgt: Tensor | None  # (B, T) the whole target so far, without the cache


class EncoderDecoderAdapter(ModelAdapter):
    """A Transformer ``EncoderDecoder``: ``input_ids`` is the source (any padding); the target starts from
    ``bos_id`` (see the module docstring)."""

    input_name = "source"

    def __init__(self, model: nn.Module, bos_id: int, use_cache: bool = True) -> None:
        self.model = model
        self.bos_id = bos_id
        self.use_cache = use_cache
        self.max_length = model.config.max_seq_len

    def prepare(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Tensor, int]:
        check_prompts(input_ids, attention_mask, self.input_name, self.max_length)
        # The decoder reads the start token and all new tokens but the last: max_new_tokens positions.
        max_new_tokens = cap_new_tokens(max_new_tokens, self.max_length,
                                        f"the decoder reads at most max_seq_len={self.max_length} positions")
        return input_ids, attention_mask, max_new_tokens

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, _Seq2SeqState]:
        src_mask = None if bool(attention_mask.all()) else attention_mask
        memory = self.model.encode(input_ids, src_mask)  # (B, S, D)
        tgt = input_ids.new_full((input_ids.shape[0], 1), self.bos_id)  # (B, 1)
        cache = self.model.new_cache() if self.use_cache else None
        state = _Seq2SeqState(memory, src_mask, cache, None if cache is not None else tgt)
        return self._last_logits(tgt, state), state

    def step(self, state: _Seq2SeqState, next_ids: Tensor) -> tuple[Tensor, _Seq2SeqState]:
        if state.cache is not None:
            return self._last_logits(next_ids[:, None], state), state
        assert state.tgt is not None
        state.tgt = torch.cat((state.tgt, next_ids[:, None]), dim=1)  # (B, T)
        return self._last_logits(state.tgt, state), state

    def reorder(self, state: _Seq2SeqState, index: Tensor) -> _Seq2SeqState:
        state.memory = state.memory.index_select(0, index)
        if state.src_mask is not None:
            state.src_mask = state.src_mask.index_select(0, index)
        if state.cache is not None:
            state.cache.reorder(index)
        if state.tgt is not None:
            state.tgt = state.tgt.index_select(0, index)
        return state

    def _last_logits(self, tgt: Tensor, state: _Seq2SeqState) -> Tensor:
        out = self.model.decode(tgt, state.memory, state.src_mask, cache=state.cache, return_logits=False)
        return self.model.lm_logits(out.last_hidden_state[:, -1])  # (B, V)


# ------------------------------------------------------------------------------------------------ recurrent
class RecurrentAdapter(ModelAdapter):
    """An RNN encoder-decoder (``RNNSeq2Seq``) or any model with ``encode(src_ids, src_mask) -> state``,
    ``decode_step(prev_ids (B,), state) -> (logits (B, V), state)`` and ``reorder_state(state, index) -> state``.

    The source is encoded once; the decoder starts from ``bos_id`` and carries its state (hidden/cell, the
    input-feeding vector, memory and mask, whatever the model keeps) from step to step. That state is the whole
    history, so there is no uncached path: ``use_cache`` has no effect. No length limit is imposed.
    """

    input_name = "source"

    def __init__(self, model: Any, bos_id: int) -> None:
        self.model = model
        self.bos_id = bos_id

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Any]:
        state = self.model.encode(input_ids, None if bool(attention_mask.all()) else attention_mask)
        start_ids = input_ids.new_full((input_ids.shape[0],), self.bos_id)  # (B,)
        return self.model.decode_step(start_ids, state)

    def step(self, state: Any, next_ids: Tensor) -> tuple[Tensor, Any]:
        return self.model.decode_step(next_ids, state)

    def reorder(self, state: Any, index: Tensor) -> Any:
        return self.model.reorder_state(state, index)


class RecurrentLMAdapter(ModelAdapter):
    """A recurrent causal language model (``AWDLSTM``; ELMo's ``BiLM`` through its forward LM):
    ``run(ids, attention_mask=, state=)`` returns ``last_hidden_state`` and ``state``, ``model.lm_logits(h)`` the
    next-token scores, ``model.reorder_state(state, index)`` the kept rows of a state.

    ``run`` is ``model`` itself by default (``AWDLSTM.forward``); ``BiLM`` passes ``model.forward_lm``.

    The prompt is continued (its tokens are the processors' context). Prompts are re-packed so each row's real
    tokens come first (right padding, which the model reads with packed sequences), and the logits of the first new
    token are those after each row's own last token.
    """

    input_name = "prompt"

    def __init__(self, model: Any, run: Any = None) -> None:
        if getattr(getattr(model, "config", None), "reverse", False):  # AWDLSTM with config.reverse
            raise LmforgeError("cannot generate with a backward language model (model.reverse=true): it reads and "
                               "predicts right to left; generate with the forward model")
        self.model = model
        self.run = model if run is None else run

    def context(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        return input_ids, attention_mask

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Any]:
        real = (attention_mask != 0).long()
        order = torch.argsort(1 - real, dim=1, stable=True)  # real tokens first, in their order
        ids, real = input_ids.gather(1, order), real.gather(1, order)
        lengths = real.sum(1)  # (B,)
        out = self.run(ids, attention_mask=None if bool(real.all()) else real)
        last = out.last_hidden_state[torch.arange(ids.shape[0], device=ids.device), lengths - 1]  # (B, D)
        return self.model.lm_logits(last), out.state

    def step(self, state: Any, next_ids: Tensor) -> tuple[Tensor, Any]:
        out = self.run(next_ids[:, None], state=state)
        return self.model.lm_logits(out.last_hidden_state[:, -1]), out.state

    def reorder(self, state: Any, index: Tensor) -> Any:
        return self.model.reorder_state(state, index)


# ------------------------------------------------------------------------------------------------------ XLNet
@dataclass
class _XLNetState:
    mems: tuple[Tensor, ...] | None  # L x (B, S, D), with the cache
    mems_mask: Tensor | None  # (B, S) of the memory, None = no padding (with the cache)
    ids: Tensor | None  # (B, S) the whole sequence so far, without the cache
    mask: Tensor | None  # (B, S), without the cache (None = no padding)


class XLNetAdapter(ModelAdapter):
    """An ``XLNet``: the prompt is continued, left to right (see the module docstring and ``XLNet.forward_lm``).

    Any padding layout is accepted and re-packed to left padding, so that every row's next token sits in the same
    column; padding is hidden from every query (in the memory through ``mems_mask``), and relative positions ignore
    it, so a padded row generates what it would alone. The memory keeps the whole context: each step costs one
    token's pass against it (and the same result as reading the whole sequence again, ``use_cache=False``).
    """

    input_name = "prompt"

    def __init__(self, model: nn.Module, use_cache: bool = True, stream: str = "query") -> None:
        """``stream``: "query" (XLNet's prediction through a dummy token) or "content" (the last content state
        predicts the next token, a Transformer-XL LM); see ``XLNet.forward_lm``."""
        if stream not in ("query", "content"):
            raise LmforgeError(f"stream must be 'query' or 'content'; got {stream!r}")
        self.model = model
        self.use_cache = use_cache
        self.stream = stream

    def prepare(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, Tensor, int]:
        check_prompts(input_ids, attention_mask, self.input_name, self.max_length)
        input_ids, attention_mask = left_pad(input_ids, attention_mask)
        return input_ids, attention_mask, max_new_tokens

    def context(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        return input_ids, attention_mask

    def start(self, input_ids: Tensor, attention_mask: Tensor, max_new_tokens: int) -> tuple[Tensor, _XLNetState]:
        mask = None if bool(attention_mask.all()) else attention_mask
        out = self.model.forward_lm(input_ids, attention_mask=mask, stream=self.stream)
        logits = self.model.lm_logits(out.last_hidden_state[:, -1])  # (B, V)
        if self.use_cache:
            return logits, _XLNetState(out.mems, mask, None, None)
        return logits, _XLNetState(None, None, input_ids, mask)

    def step(self, state: _XLNetState, next_ids: Tensor) -> tuple[Tensor, _XLNetState]:
        if state.mems is None:  # without the cache: the whole sequence again
            assert state.ids is not None
            state.ids = torch.cat((state.ids, next_ids[:, None]), dim=1)
            if state.mask is not None:
                state.mask = torch.cat((state.mask, state.mask.new_ones((state.mask.shape[0], 1))), dim=1)
            out = self.model.forward_lm(state.ids, attention_mask=state.mask, stream=self.stream)
        else:
            out = self.model.forward_lm(next_ids[:, None], mems=state.mems, mems_mask=state.mems_mask,
                                        stream=self.stream)
            state.mems = out.mems
            if state.mems_mask is not None:
                ones = state.mems_mask.new_ones((state.mems_mask.shape[0], 1))
                state.mems_mask = torch.cat((state.mems_mask, ones), dim=1)
        return self.model.lm_logits(out.last_hidden_state[:, -1]), state

    def reorder(self, state: _XLNetState, index: Tensor) -> _XLNetState:
        if state.mems is not None:
            state.mems = tuple(m.index_select(0, index) for m in state.mems)
        for name in ("mems_mask", "ids", "mask"):
            value = getattr(state, name)
            if value is not None:
                setattr(state, name, value.index_select(0, index))
        return state


# --------------------------------------------------------------------------------------------------- choice
def adapter_for(model: Any, *, use_cache: bool = True, bos_id: int | None = None) -> GenerationAdapter:
    """The adapter for ``model`` (see the module docstring); an object that is already an adapter is returned.

    Raises:
        LmforgeError: an encoder-decoder without ``bos_id``, or a model no adapter knows.
    """
    if all(callable(getattr(model, name, None)) for name in ("start", "step", "reorder")):
        return model
    from lmforge.models.awd_lstm import AWDLSTM
    from lmforge.models.decoder import Decoder
    from lmforge.models.elmo import BiLM, ELMoEncoder
    from lmforge.models.seq2seq import EncoderDecoder
    from lmforge.models.xlnet import XLNet

    if isinstance(model, Decoder):
        return DecoderAdapter(model, use_cache)
    if getattr(model, "logits_in_graph", False):  # a GPT run by ONNX Runtime: always with its cache (the graph's
        return DecoderAdapter(model, use_cache=True)  # inputs and outputs; the tokens are the same without it)
    if isinstance(model, XLNet):
        return XLNetAdapter(model, use_cache, stream=getattr(model.config, "lm_stream", "query"))
    if isinstance(model, AWDLSTM):
        return RecurrentLMAdapter(model)
    if isinstance(model, BiLM):
        return RecurrentLMAdapter(model, run=model.forward_lm)
    if isinstance(model, ELMoEncoder):
        raise LmforgeError("cannot generate with an ELMoEncoder (a fine-tuned ELMo task model): generation runs the "
                           "biLM's forward language model; use the biLM folder it was fine-tuned from (lmforge "
                           "pretrain --objective bilm), or pass model.bilm")
    encoder_decoder = isinstance(model, EncoderDecoder)
    recurrent = all(callable(getattr(model, name, None)) for name in ("encode", "decode_step", "reorder_state"))
    if encoder_decoder or recurrent:
        if bos_id is None:
            raise LmforgeError(f"{type(model).__name__} is an encoder-decoder: its decoder needs a start token; "
                               "pass bos_id (the id its training targets start with, e.g. the tokenizer's "
                               "cls_id)")
        return EncoderDecoderAdapter(model, bos_id, use_cache) if encoder_decoder else RecurrentAdapter(model, bos_id)
    raise LmforgeError(f"cannot generate with a {type(model).__name__}: generation needs a Decoder (GPT), an "
                       "XLNet, an AWDLSTM, ELMo's BiLM (its forward LM), an EncoderDecoder, an RNNSeq2Seq "
                       "(encode/decode_step/reorder_state), or an adapter with start/step/reorder")
