"""Checks of what a model is given at its API boundary: token ids, id ranges, layer selections, flags.

Shape legend: B batch, T length.

Why one module: every model family validated its ids with its own copy of the same few lines, and the copies had
drifted (one accepted an empty batch, one took ``True`` as a layer index). Each model calls these instead, so a
bad input gets the same clear ``LmforgeError`` from every family, and a fix lands everywhere at once. They run
before any kernel, because an out-of-range id crashes the embedding lookup (on GPU with an unreadable
device-side assert) and an empty batch fails deep inside a reduction.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from lmforge.errors import LmforgeError
from lmforge.nn.capture import capturing

__all__ = ["check_flag", "check_id_range", "check_input_ids", "check_integer_tensor", "select_layers"]


def check_integer_tensor(ids: object, name: str, *, what: str = "ids") -> Tensor:
    """Check that ``ids`` is a tensor of integers (not float, complex or bool), whatever its shape.

    Args:
        ids: the value passed by the caller.
        name: the argument's name, for the message (e.g. "position_ids").
        what: what the integers are, for the message (e.g. "token ids").

    Returns:
        ``ids``, now known to be an integer tensor.
    """
    if not isinstance(ids, Tensor):
        raise LmforgeError(f"{name} must be a torch tensor of integer {what}; got {type(ids).__name__}")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise LmforgeError(f"{name} must hold integer {what} (integers such as torch.long); got dtype {ids.dtype}")
    return ids


def check_id_range(ids: Tensor, size: int, *, name: str, what: str, limit: str) -> None:
    """Raise naming the first id outside [0, size) and where it is.

    One reduction (and one device sync) when every id is valid; the search for the culprit runs only on failure.

    Args:
        ids: (B, T) or (T,) integer tensor, not empty.
        size: the number of valid ids.
        name: the argument's name, for the message (e.g. "src_ids").
        what: one id, for the message (e.g. "token id").
        limit: what ``size`` is, for the message (e.g. "the vocabulary of size 99").
    """
    if capturing():  # a data-dependent branch would split the compiled graph: the check is the
        return  # eager path's (lmforge.utils.compiling: compiled callers read ids their own tokenizer made)
    lo, hi = torch.aminmax(ids)
    if int(lo) >= 0 and int(hi) < size:
        return
    bad = ((ids < 0) | (ids >= size)).nonzero()[0].tolist()  # first offending index
    value = int(ids[tuple(bad)])
    where = f" at (batch {bad[0]}, position {bad[1]})" if len(bad) == 2 else f" at position {bad[0]}"
    raise LmforgeError(f"{name}: {what} {value}{where} is outside {limit} (valid ids are 0 .. {size - 1})")


def check_input_ids(ids: object, *, vocab_size: int, name: str = "input_ids") -> tuple[int, int]:
    """Check a batch of token ids: a (B, T) integer tensor with B >= 1, T >= 1 and every id in [0, vocab_size).

    Args:
        ids: the value passed by the caller.
        vocab_size: V, the number of rows of the embedding the ids index.
        name: the argument's name, for the message (e.g. "tgt_ids").

    Returns:
        ``(B, T)``.
    """
    ids = check_integer_tensor(ids, name, what="token ids")
    if ids.dim() != 2:
        hint = f" (add a batch dimension: {name}.unsqueeze(0))" if ids.dim() == 1 else ""
        raise LmforgeError(f"{name} must be a (batch, length) tensor of token ids; got shape {tuple(ids.shape)}{hint}")
    B, T = ids.shape
    if B == 0 or T == 0:
        raise LmforgeError(f"{name} is empty (batch size {B}, length {T}); pass at least one row of at least one "
                           "token")
    check_id_range(ids, vocab_size, name=name, what="token id", limit=f"the vocabulary of size {vocab_size}")
    return B, T


def select_layers(requested: bool | Iterable[int], n_layers: int, *, name: str = "output_attentions") -> frozenset[int]:
    """Normalise a layer selection: True = every layer, False = none, or an iterable of layer indices.

    Negative indices count from the end. A bool inside the sequence is refused: ``True`` is an ``int`` to Python
    (so it would silently mean layer 1), but nobody writing ``[True]`` means layer 1.

    Args:
        requested: the caller's value.
        n_layers: L, the number of layers of the stack.
        name: the argument's name, for the message.

    Returns:
        The chosen layer indices, each in [0, L).
    """
    if isinstance(requested, bool):
        return frozenset(range(n_layers)) if requested else frozenset()
    if isinstance(requested, str | bytes) or not isinstance(requested, Iterable):
        raise LmforgeError(f"{name} must be True, False or a sequence of layer indices; got {requested!r}")
    chosen = set()
    for i in requested:
        if isinstance(i, bool) or not isinstance(i, int) or not -n_layers <= i < n_layers:
            raise LmforgeError(
                f"{name}: layer index {i!r} does not exist in a {n_layers}-layer model (valid indices are "
                f"0 .. {n_layers - 1}, or -{n_layers} .. -1 from the end)")
        chosen.add(i % n_layers)
    return frozenset(chosen)


def check_flag(value: object, name: str) -> bool:
    """Check an on/off option of a model that has no per-layer selection (e.g. ``output_attentions`` of a model
    that returns every layer's weights or none).

    Why: a list of layer indices given to such a model used to be taken as "true" and silently return every layer;
    refusing it keeps "a bool is never a layer index, and a layer index is never a bool" true in every family.

    Returns:
        ``value``, known to be a bool.
    """
    if not isinstance(value, bool):
        raise LmforgeError(f"{name} must be True or False here (this model has no per-layer selection); got "
                           f"{value!r}")
    return value
