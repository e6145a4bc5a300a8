"""CPU speed kernels, each next to the plain reference it is tested against.

Shape legend: each kernel's module has its own (B batch, T length, D width, V vocabulary, H heads, ...).

Every module here is a fast path for something PyTorch already computes plainly: the fast function is what the
models call, the reference (``plain_*``, ``padded_*``) is the readable computation it must equal (to float rounding,
forward and, where the kernel has a backward, gradients; random kernels from the same generator state).
``KERNEL_TABLE`` lists them, and ``tests/nn/test_kernel_table.py`` walks it on small random inputs.

The old module paths (``lmforge.nn.packed_dropout``, ``lmforge.nn.few_rows``, ``lmforge.nn.packing``,
``lmforge.nn.linear_ce``, ``lmforge.nn.tied_embedding``) re-export these modules' names.

The attention kernels of ``MultiHeadAttention`` (``lmforge.nn.attention.KERNELS``: "sdpa" against the "math"
reference) are chosen by name in a model's config and stay there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from lmforge.nn.kernels.dropout_attention import dropout_attention, plain_dropout_attention
from lmforge.nn.kernels.few_rows import plain_project_rows, project_rows
from lmforge.nn.kernels.linear_ce import linear_cross_entropy, plain_linear_cross_entropy
from lmforge.nn.kernels.lowp_attention import lowp_attention, plain_lowp_attention
from lmforge.nn.kernels.packed_dropout import dropout, plain_dropout
from lmforge.nn.kernels.packing import packed_tokenwise, padded_tokenwise
from lmforge.nn.kernels.tied_embedding import plain_tied_logits, tied_logits

__all__ = ["KERNEL_TABLE", "Kernel"]


class Kernel(NamedTuple):
    """One entry of ``KERNEL_TABLE``: (fast function, plain reference function, one-line description); the two
    functions take the same arguments."""

    fast: Callable[..., Any]
    reference: Callable[..., Any]
    description: str


KERNEL_TABLE: dict[str, Kernel] = {
    "packed_dropout": Kernel(
        dropout, plain_dropout,
        "dropout whose CPU mask reads two 32-bit lanes from each 64-bit random draw (issue 22, item 2)"),
    "dropout_attention": Kernel(
        dropout_attention, plain_dropout_attention,
        "attention with dropout on its weights, in cache-sized row chunks, softmax's backward from the output"),
    "lowp_attention": Kernel(
        lowp_attention, plain_lowp_attention,
        "attention without dropout for bf16 / fp16 operands: fp32 scores in cache-sized row chunks (issue 39)"),
    "few_rows": Kernel(
        project_rows, plain_project_rows,
        "a decoding step's few-row vocabulary projection: the faster of F.linear and W @ x^T, timed once per shape"),
    "packing": Kernel(
        packed_tokenwise, padded_tokenwise,
        "token-wise layers on the real tokens of a padded batch only (unpadding, issue 22, item 1)"),
    "linear_ce": Kernel(
        linear_cross_entropy, plain_linear_cross_entropy,
        "the vocabulary projection and its cross-entropy in row chunks, never holding the (N, V) logits"),
    "tied_embedding": Kernel(
        tied_logits, plain_tied_logits,
        "one dense gradient for a token embedding tied to the output projection, not two added together"),
}
