"""The vocabulary projection and its cross-entropy in one pass over row chunks, never holding the (N, V) logits.

Shape legend: N rows (the flattened (B, T) positions), D state width, V vocabulary; C rows of one chunk.

A language model's last step, ``loss = CE(h W^T, y)``, is its largest matrix product (the vocabulary is wider than
any layer) and, done plainly, materialises the (N, V) logits several times: the product, an fp32 copy, the softmax
saved for backward, its gradient, and an argmax pass for the accuracy. Here the rows go through in chunks of
``chunk_rows``; for each chunk the logits are formed, reduced to the loss and the number of correct argmax
predictions, and, when a gradient is wanted, turned at once into this chunk's gradient:

    p = softmax(h_c W^T)  (rows with a label; ignored rows 0),  p[i, y_i] -= 1
    dL/dh_c = p W,  dL/dW += p^T h_c

so only (chunk_rows, V) is alive at a time and backward is a multiplication by the incoming scalar. The FLOPs are
those of the plain path (one product forward, two backward); what is saved is memory and memory traffic. The
gradients equal autograd's through ``F.cross_entropy(F.linear(h, W), y, reduction="sum")`` (tested to fp32
round-off).

Under bf16 autocast the products run in bf16 as they would in ``F.linear``; the softmax is computed in fp32 and
written in bf16, the gradient's dtype under autocast, with the loss and the target's own gradient entry taken in fp32
from the others' sum (``_bf16_softmax_gradient``); the weight's gradient sums are fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lmforge.nn.kernels.tied_embedding import find_tied_lookup, hand_over

__all__ = ["CHUNK_ROWS", "IGNORE", "auto_chunk_rows", "linear_cross_entropy", "plain_linear_cross_entropy"]

IGNORE = -100
CHUNK_ROWS = 512  # rows per chunk on a GPU: (512, V) fp32 scores, 16 MB at V = 8,000
CPU_CHUNK_ROWS = 1024  # the most rows per chunk on a CPU (see auto_chunk_rows)
CPU_SCORE_BYTES = 256 * 2**20  # and the most bytes of one chunk's (rows, V) fp32 scores there
MIN_CHUNK_ROWS = 64


def auto_chunk_rows(vocab: int, device_type: str) -> int:
    """Rows per chunk: ``CHUNK_ROWS`` on a GPU; on a CPU ``CPU_CHUNK_ROWS``, or fewer where one chunk's (rows, V)
    fp32 scores would pass ``CPU_SCORE_BYTES`` (a 250,000-word vocabulary: 256 rows).

    Each chunk's weight gradient, dL/dW += p^T h_c, is a product whose depth is the chunk's rows and which reads and
    writes the whole (V, D) gradient: with few rows it is bound by that memory traffic, and more so with every
    thread added. Measured with glibc malloc tuned (as lmforge's training commands run), N = 2,032, D = 192, V =
    50,257, forward and backward: one thread 1,329 / 1,297 / 1,279 ms at 112 / 512 / 1,024 rows (the plain
    ``F.cross_entropy(F.linear(...))``: 1,338 ms), two threads 2,374 / 1,487 / 1,382 ms (plain: 1,382 ms). Keeping a
    chunk's scores in the last-level cache (112 rows here, the earlier rule) paid only against glibc's untuned
    allocator. At 1,024 rows the scores are 206 MB at V = 50,257: the memory still stays bounded by the chunk,
    whatever N."""
    if device_type != "cpu":
        return CHUNK_ROWS
    rows = min(CPU_CHUNK_ROWS, CPU_SCORE_BYTES // (4 * max(vocab, 1)))
    return max(MIN_CHUNK_ROWS, rows // 16 * 16)


def _argmax_hits(scores: Tensor, picked: Tensor, target: Tensor, valid: Tensor,
                 logits: Tensor | None = None) -> Tensor:
    """How many valid rows have ``argmax(row) == target``, given each row's ``scores`` with the target's own entry
    pushed below every other (``picked`` holds its true value).

    ``amax`` over the others is one vectorised pass, about eight times faster than ``argmax``: a row is a hit when
    its target beats every other entry. Rows where it only ties them (rare, except e.g. all-equal scores) are
    restored and decided by ``argmax`` itself (the first maximal index); on ``logits`` when given (the untouched
    rows whose monotone image ``scores`` is, where rounding may have made ties the logits do not have)."""
    others = scores.amax(-1)  # (C,) the best entry apart from the target
    hits = (picked > others) & valid
    tied = ((picked == others) & valid).nonzero().squeeze(1)  # (k,) usually empty
    if tied.numel() and logits is not None:
        hits[tied] = logits.index_select(0, tied).argmax(-1) == target[tied]
    elif tied.numel():  # the rows as they were, and argmax's own rule (the first maximal index)
        rows = scores.index_select(0, tied)  # (k, V)
        rows[torch.arange(tied.numel(), device=rows.device), target[tied]] = picked[tied]
        hits[tied] = rows.argmax(-1) == target[tied]
    return hits.sum()


def _exact_where_tiny(picked: Tensor, picked_p: Tensor, logits: Tensor, target: Tensor, dtype: torch.dtype) -> None:
    """Where a picked probability is too small for its logarithm to keep ``dtype``'s precision (a confident wrong
    prediction), set that row's log-probability in ``picked`` exactly from its logits, in place."""
    tiny = (picked_p < torch.finfo(dtype).tiny * 1e8).nonzero().squeeze(1)  # (k,) usually empty
    if tiny.numel():
        exact = logits.index_select(0, tiny).to(dtype)  # (k, V)
        picked[tiny] = exact.gather(1, target[tiny, None]).squeeze(1) - torch.logsumexp(exact, dim=-1)


def _bf16_softmax_gradient(logits: Tensor, target: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Training's per-chunk pass for bf16 logits: (p - onehot(target) in bf16, -log p_target in fp32, hits).

    The softmax reads the bf16 logits and writes bf16 probabilities (computed in fp32, rounded once): the gradient
    the products read, in the dtype autocast would give it, without the fp32 copy of the logits, the fp32
    probabilities and their cast back (3.5x faster per chunk at (1,024, 50,257), one thread). The two entries that
    rounding would spoil are taken from the others' sum instead: the target's gradient p_t - 1 = -(sum of the other
    probabilities) (accumulated in fp32: the bf16 p_t - 1 of a confident prediction would be 0), and, for p_t > 0.5,
    the loss -log p_t = -log1p(-others). Below that the loss is -log of the rounded p_t, within 2^-9 of the exact
    value: a tenth of what rounding the logits to bf16 (as both this and an autocast ``F.linear`` do) already
    moves it by at |logit| ~ 10."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    p = torch.softmax(logits, dim=-1)  # (C, V) bf16
    picked_p = p[rows, target].float()  # (C,)
    p[rows, target] = 0.0
    others = p.sum(-1).float()  # (C,) sum_{j != t} p_j, accumulated in fp32, rounded once
    picked = torch.where(picked_p > 0.5, torch.log1p(-others), picked_p.log())  # (C,) log p_t
    _exact_where_tiny(picked, picked_p, logits, target, torch.float32)
    p[rows, target] = (-others).to(p.dtype)  # p_t - 1, below every other entry (>= 0)
    hits = _argmax_hits(p, picked_p.to(p.dtype), target, valid, logits=logits)  # softmax keeps the order
    return p, -picked, hits


def _chunked(hidden: Tensor, weight: Tensor, labels: Tensor, chunk_rows: int, ignore_index: int,
             grad_hidden: Tensor | None, grad_weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """The loss sum and correct count; fills ``grad_hidden`` (N, D) and ``grad_weight`` (V, D, fp32; its contents
    are overwritten) with the gradient of the loss sum when they are given.

    Under autocast the weight and the states are cast to its dtype ONCE here (autocast would cast them again for
    every product of every chunk) and the products run with autocast off. In training, per chunk the (C, V) scores
    are written by the product, turned into the softmax, and read by one ``amax`` (the accuracy) and the two gradient
    products."""
    device = hidden.device.type
    amp = torch.is_autocast_enabled(device) if hasattr(torch, "get_autocast_dtype") else torch.is_autocast_enabled()
    compute = torch.get_autocast_dtype(device) if amp and hasattr(torch, "get_autocast_dtype") else \
        torch.get_autocast_cpu_dtype() if amp else hidden.dtype
    weight_c = weight.detach().to(compute)  # (V, D)
    hidden_c = hidden.detach().to(compute)  # (N, D)
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    correct = torch.zeros((), dtype=torch.long, device=hidden.device)
    with torch.autocast(device, enabled=False):
        for start in range(0, hidden.shape[0], chunk_rows):
            h = hidden_c[start:start + chunk_rows]  # (C, D)
            y = labels[start:start + chunk_rows]  # (C,)
            valid = y != ignore_index  # (C,)
            target = y.clamp(min=0)  # (C,) any index for ignored rows; masked below
            logits = F.linear(h, weight_c)  # (C, V) in the compute dtype
            score_dtype = torch.promote_types(logits.dtype, torch.float32)
            if grad_hidden is None and grad_weight is None:  # evaluation: the log-probabilities are all it needs
                logp = torch.log_softmax(logits, dim=-1, dtype=score_dtype)  # (C, V) fp32 (fp64 for fp64 inputs)
                picked = logp.gather(1, target[:, None]).squeeze(1)  # (C,)
                loss = loss - (picked * valid).sum()
                logp[torch.arange(logp.shape[0], device=logp.device), target] = -torch.inf  # the others' best
                correct = correct + _argmax_hits(logp, picked, target, valid)
                continue
            if logits.dtype == torch.bfloat16:  # bf16 autocast: bf16 probabilities (_bf16_softmax_gradient)
                p, nll, hits = _bf16_softmax_gradient(logits, target, valid)
                loss = loss + (nll * valid).sum()
                correct = correct + hits
                del logits
            else:
                # the softmax itself (one pass fewer than log_softmax + exp), the loss from the picked
                # probabilities' logarithm; where a picked probability is too small for its logarithm to keep the
                # dtype's precision (a confident wrong prediction), that row's log-probability is computed exactly
                p = torch.softmax(logits, dim=-1, dtype=score_dtype)  # (C, V)
                picked_p = p.gather(1, target[:, None]).squeeze(1)  # (C,)
                picked = picked_p.log()
                _exact_where_tiny(picked, picked_p, logits, target, score_dtype)
                loss = loss - (picked * valid).sum()
                del logits
                p[torch.arange(p.shape[0], device=p.device), target] -= 1.0  # the target's own entry now <= 0
                correct = correct + _argmax_hits(p, picked_p, target, valid)  # softmax keeps each row's order
            ignored = (~valid).nonzero().squeeze(1)  # (k,) usually a few rows (a causal LM's last position)
            if ignored.numel():
                p.index_fill_(0, ignored, 0.0)  # ignored rows send no gradient; touches only those rows
            p = p.to(compute)
            if grad_hidden is not None:
                rows = grad_hidden[start:start + chunk_rows]  # (C, D), contiguous rows
                if rows.dtype == p.dtype:
                    torch.mm(p, weight_c, out=rows)  # straight into place, no temporary
                else:
                    rows.copy_(p @ weight_c)
            if grad_weight is not None:
                if grad_weight.dtype == p.dtype:  # (V, D) written, then accumulated, by the GEMM: no temporary
                    if start == 0:
                        torch.mm(p.t(), h, out=grad_weight)
                    else:
                        grad_weight.addmm_(p.t(), h)
                elif start == 0:  # bf16 products into the fp32 sum
                    grad_weight.copy_(p.t() @ h)
                else:
                    grad_weight += (p.t() @ h).to(grad_weight.dtype)
    if grad_weight is not None and hidden.shape[0] == 0:
        grad_weight.zero_()  # no rows: the (uninitialised) sum is zero
    return loss, correct


class _LinearCrossEntropy(torch.autograd.Function):
    """Gradients computed in forward (``_chunked``) and kept on ``ctx``; backward scales them by the incoming
    scalar IN PLACE and hands them over (no second (V, D) tensor). A second backward through the same graph
    (``retain_graph=True``) finds them handed over and computes them again from the saved inputs."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, chunk_rows: int,  # type: ignore[override]
                ignore_index: int) -> tuple[Tensor, Tensor]:
        grad_hidden, grad_weight = _gradient_buffers(hidden, weight, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        loss, correct = _chunked(hidden, weight, labels, chunk_rows, ignore_index, grad_hidden, grad_weight)
        ctx.save_for_backward(hidden, weight, labels)
        ctx.chunk_rows, ctx.ignore_index = chunk_rows, ignore_index
        ctx.grads = (grad_hidden, grad_weight)
        ctx.lookup = find_tied_lookup(hidden, weight) if grad_weight is not None else None  # a tied embedding
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_correct: Tensor):  # type: ignore[override]
        hidden, weight, labels = ctx.saved_tensors
        grads, ctx.grads = ctx.grads, None  # handed over: the graph keeps no reference to them
        if grads is None:  # a second backward (retain_graph=True): the first one scaled and handed them over
            grads = _gradient_buffers(hidden, weight, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
            _chunked(hidden, weight, labels, ctx.chunk_rows, ctx.ignore_index, *grads)
        grad_hidden, grad_weight = grads
        dh = dw = None
        if grad_hidden is not None:
            dh = grad_hidden.mul_(grad_loss.to(grad_hidden.dtype))
        if grad_weight is not None:
            dw = grad_weight.mul_(grad_loss).to(weight.dtype)  # fp32 sums; cast once for a bf16 weight
            dw = hand_over(ctx.lookup, dw)  # to a tied token embedding's look-up, which adds its rows
        return dh, dw, None, None, None


def _gradient_buffers(hidden: Tensor, weight: Tensor, want_hidden: bool,
                      want_weight: bool) -> tuple[Tensor | None, Tensor | None]:
    """Uninitialised (N, D) and (V, D, fp32 or wider) gradient tensors for ``_chunked`` to fill."""
    grad_hidden = torch.empty_like(hidden) if want_hidden else None
    grad_weight = torch.empty(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32),
                              device=weight.device) if want_weight else None
    return grad_hidden, grad_weight


def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, ignore_index: int = IGNORE,
                         chunk_rows: int | None = None) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy of ``hidden @ weight.T`` against ``labels``, and the number of correct argmax
    predictions, without materialising the logits (see the module docstring).

    Args:
        hidden: (N, D) final states (any leading shape is flattened by the caller).
        weight: (V, D) the output projection (a tied token embedding, or an LM head's weight).
        labels: (N,) target ids, ``ignore_index`` where nothing is predicted.
        ignore_index: the label of rows without a target.
        chunk_rows: rows per chunk (default: ``auto_chunk_rows`` for the weight's shape and device).

    Returns:
        (loss_sum () fp32, differentiable; correct () int64).
    """
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1] or weight.dim() != 2 \
            or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"linear_cross_entropy needs hidden (N, D), weight (V, D) and labels (N,); got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(labels.shape)}")
    if chunk_rows is None:
        chunk_rows = auto_chunk_rows(weight.shape[0], hidden.device.type)
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive; got {chunk_rows}")
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        return _chunked(hidden, weight, labels, chunk_rows, ignore_index, None, None)  # evaluation: no gradients
    return _LinearCrossEntropy.apply(hidden, weight, labels, chunk_rows, ignore_index)


def plain_linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, *, ignore_index: int = IGNORE,
                               chunk_rows: int | None = None) -> tuple[Tensor, Tensor]:
    """The reference of ``linear_cross_entropy``: the (N, V) logits held, ``F.cross_entropy`` summed (in fp32, or
    fp64 for fp64 inputs) and the argmax hits counted; gradients by autograd. ``chunk_rows`` is ignored.

    Returns:
        (loss_sum (), correct () int64).
    """
    logits = F.linear(hidden, weight)  # (N, V)
    loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels,
                           ignore_index=ignore_index, reduction="sum")
    correct = ((logits.detach().argmax(-1) == labels) & (labels != ignore_index)).sum()
    return loss, correct
