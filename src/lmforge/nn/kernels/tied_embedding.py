"""One dense gradient for a token embedding tied to the output projection, instead of two added together.

Shape legend: V vocabulary, D width, N looked-up tokens (the flattened (B, T) ids).

A language model that ties its output projection to its token embedding (GPT-2, BERT's MLM head) uses one (V, D)
matrix twice, and plain autograd builds two dense (V, D) gradients and adds them: the projection's (a real
product, every entry non-zero) and the look-up's (``embedding_dense_backward``: a fresh (V, D) tensor of zeros with
the B x T used rows added in), then a full (V, D) addition. For GPT-2 small (50,257 x 768, 154 MB in fp32) that is
two passes over 154 MB and, under glibc malloc, a fresh mapping whose pages fault in one by one, all for 1,024
used rows. (A sparse gradient from the look-up does not help: autograd adds a sparse gradient out of place.)

Here the projection hands its dense gradient to the look-up instead of to autograd, and the look-up adds its used
rows into it (``index_add_``) and returns it as the weight's one gradient. The hand-over is arranged in the
projection's forward, and only when it is safe: the weight is a leaf parameter and the look-up of that same
parameter is reachable from the projection's input in the autograd graph (a walk over the graph; at most
``MAX_WALK`` nodes), so autograd runs the look-up's backward after the projection's in every pass that computes
the weight's gradient. Several projections of one look-up add into one gradient. In every other case (no tied
look-up in the graph, a non-leaf weight, a reentrant checkpoint hiding the look-up, ``torch.compile``, a GPU,
autocast) both are torch's own. The weight's ``.grad`` equals the plain path's up to the order of the additions in
the used rows (tested), and autograd's hooks (DDP's reducer, ``register_hook``) see it as before, as one dense
gradient.

Projections that hand over: ``lmforge.nn.kernels.linear_ce`` (the chunked LM loss) and ``tied_linear`` (``F.linear``,
used by the MLM head, which ELECTRA's generator shares, and SpanBERT's boundary head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.nn.capture import capturing

__all__ = ["MAX_WALK", "embed_tokens", "find_tied_lookup", "hand_over", "plain_tied_logits", "tied_linear",
           "tied_logits"]

MAX_WALK = 50_000  # graph nodes visited looking for the look-up before giving up (a plain gradient then)


def _graph_task() -> int:
    """The id of the backward pass running now (-1 outside one, or where torch cannot say)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return int(current()) if current is not None else -1


class _TiedLookup(torch.autograd.Function):
    """``F.embedding``; its backward adds the used rows into a dense gradient handed over by tied projections, or
    is torch's dense embedding backward when none was."""

    @staticmethod
    def forward(ctx, input_ids: Tensor, weight: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(input_ids)
        ctx.weight_id, ctx.vocab = id(weight), weight.shape[0]
        ctx.handed = None  # (graph task, dense (V, D) gradient) from the projections' backward
        return F.embedding(input_ids, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (input_ids,) = ctx.saved_tensors
        handed, ctx.handed = ctx.handed, None
        if not ctx.needs_input_grad[1]:
            return None, None
        rows = grad.reshape(-1, grad.shape[-1])  # (N, D)
        ids = input_ids.reshape(-1)  # (N,)
        if handed is not None and handed[0] == _graph_task():
            return None, handed[1].index_add_(0, ids, rows.to(handed[1].dtype))
        return None, torch.ops.aten.embedding_dense_backward(rows, ids, ctx.vocab, -1, False)


def _plain(module: nn.Embedding) -> bool:
    """An ``nn.Embedding`` with nothing that changes its look-up or gradient (no padding row, norm cap, frequency
    scaling, sparse gradient or hooks), a leaf parameter on a CPU, outside ``torch.compile``."""
    w = module.weight
    return (type(module) is nn.Embedding and module.padding_idx is None and module.max_norm is None
            and not module.scale_grad_by_freq and not module.sparse and not module._forward_hooks
            and not module._forward_pre_hooks and type(w) is nn.Parameter and w.device.type == "cpu"
            and not capturing())


def embed_tokens(module: nn.Embedding, input_ids: Tensor) -> Tensor:
    """``module(input_ids)``; when the look-up is plain and a gradient is wanted, one whose backward takes a tied
    projection's dense gradient (see the module docstring)."""
    if torch.is_grad_enabled() and module.weight.requires_grad and _plain(module):
        return _TiedLookup.apply(input_ids, module.weight)
    return module(input_ids)


def find_tied_lookup(x: Tensor, weight: Tensor) -> torch.autograd.graph.Node | None:
    """The backward node of the ``embed_tokens`` look-up of ``weight`` that ``x`` depends on, or None (also when
    ``weight`` is not a leaf parameter needing a gradient, or the graph is larger than ``MAX_WALK`` nodes)."""
    if (x.grad_fn is None or weight.grad_fn is not None or not weight.requires_grad
            or capturing()):
        return None
    lookup_cls = _TiedLookup._backward_cls  # type: ignore[attr-defined]
    seen = {x.grad_fn}
    stack = [x.grad_fn]
    while stack and len(seen) <= MAX_WALK:
        node = stack.pop()
        if isinstance(node, lookup_cls) and node.weight_id == id(weight) and node.needs_input_grad[1]:
            return node
        for parent, _ in node.next_functions:
            if parent is not None and parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return None


def hand_over(lookup: torch.autograd.graph.Node | None, grad_weight: Tensor) -> Tensor | None:
    """From a projection's backward: give ``grad_weight`` to ``lookup`` (from ``find_tied_lookup`` in its forward)
    and return None for autograd, or return ``grad_weight`` itself when there is no look-up to give it to."""
    if lookup is None:
        return grad_weight
    task = _graph_task()
    if task < 0:
        return grad_weight
    handed = lookup.handed
    if handed is not None and handed[0] == task:  # another projection of the same look-up in this pass
        handed[1].add_(grad_weight)
    else:
        lookup.handed = (task, grad_weight)
    return None


class _TiedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.lookup = find_tied_lookup(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # (N, V); one dtype throughout (never under autocast)
        dx = (g @ weight).reshape(x.shape) if ctx.needs_input_grad[0] else None  # (..., D)
        dw = db = None
        if ctx.needs_input_grad[1]:
            dw = hand_over(ctx.lookup, g.t() @ x.reshape(-1, x.shape[-1]))  # (V, D)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g.sum(0)
        return dx, dw, db


def _cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def tied_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for an output projection tied to a token embedding, whose weight gradient goes
    to the look-up (see the module docstring). Under autocast, on a GPU, or where no gradient is wanted, it is
    ``F.linear`` itself."""
    if (not torch.is_grad_enabled() or not weight.requires_grad or weight.device.type != "cpu"
            or _cpu_autocast() or capturing()):
        return F.linear(x, weight, bias)
    return _TiedLinear.apply(x, weight, bias)


def tied_logits(input_ids: Tensor, weight: Tensor) -> Tensor:
    """Look ``input_ids`` up in ``weight`` (V, D) and project the embeddings back onto it: ``embed_tokens``'s
    look-up and ``tied_linear`` on a bare leaf weight (a language model without layers), so that the weight's
    gradient is the one dense tensor the projection hands to the look-up.

    Returns:
        (..., V) scores for ``input_ids`` of shape (...).
    """
    if torch.is_grad_enabled() and weight.requires_grad and weight.device.type == "cpu" \
            and not capturing():
        return tied_linear(_TiedLookup.apply(input_ids, weight), weight)
    return tied_linear(F.embedding(input_ids, weight), weight)


def plain_tied_logits(input_ids: Tensor, weight: Tensor) -> Tensor:
    """The reference of ``tied_logits``: ``F.linear(F.embedding(input_ids, weight), weight)``, two dense gradients
    added by autograd."""
    return F.linear(F.embedding(input_ids, weight), weight)
