"""A character CNN token encoder with highway layers: the token layer of Kim et al. 2016 ("Character-Aware Neural
Language Models"), Jozefowicz et al. 2016 ("Exploring the Limits of Language Modeling", CNN inputs) and ELMo (Peters
et al. 2018).

Shape legend: B batch, T tokens, C characters per token (``max_chars``), E character embedding width, F total
filters (sum of the filter counts), D output width, V vocabulary.

    characters (B, T, C) ──► char embeddings (padding char = 0 vector)                      (B, T, C, E)
                         ──► per filter width w: conv1d (n_w filters), max over the valid windows, ReLU
                         ──► concatenated                                                    (B, T, F)
                         ──► highway layers: x = t * relu(W_H x) + (1 - t) * x, t = sigmoid(W_T x)
                         ──► linear projection                                               (B, T, D)

Spelling (``spell_tokens``): a token becomes ``[BOW, its UTF-8 bytes, EOW]`` (bytes cut to ``max_chars - 2``), then
the padding character 0; a byte b is character b + 1. ELMo's begin/end-of-sentence tokens ``<S>``/``</S>`` have their
own characters; here the tokenizer's boundary tokens ``[CLS]`` and ``[SEP]`` are both spelled ``[BOW, BOUNDARY,
EOW]``: the biLM's training stream separates documents with [SEP] and fine-tuning inputs start with [CLS], so the
two are one input symbol (as softmax targets they stay distinct ids). A word piece ``##ing`` is spelled with its
``##``, which tells continuation pieces apart.

Padding characters never change a token's vector: their embedding is zero and fixed, and only windows that start
inside the token (or the first window, for a token shorter than the filter) enter the max-pool, so the output is
the same for any ``max_chars`` >= the widest filter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LmforgeError

__all__ = ["BOUNDARY_TOKENS", "BOW", "BOUNDARY", "CharCNN", "EOW", "N_CHARS", "PAD_CHAR", "Highway", "spell_tokens"]

PAD_CHAR, BOW, EOW, BOUNDARY = 0, 257, 258, 259
N_CHARS = 260  # padding, 256 bytes, begin-of-word, end-of-word, sentence boundary
BOUNDARY_TOKENS = ("[CLS]", "[SEP]")


def spell_tokens(tokens: Sequence[str], max_chars: int) -> Tensor:
    """The character ids of each vocabulary entry (see the module docstring).

    Args:
        tokens: the V vocabulary entries in id order.
        max_chars: C, characters per token with the begin and end markers (>= 3).

    Returns:
        (V, C) int16 character ids.
    """
    if max_chars < 3:
        raise LmforgeError(f"max_chars={max_chars} must be >= 3 (begin, one character, end)")
    table = torch.zeros(len(tokens), max_chars, dtype=torch.int16)
    for i, token in enumerate(tokens):
        if token in BOUNDARY_TOKENS:
            chars = [BOW, BOUNDARY, EOW]
        elif token == "[PAD]":
            continue  # all padding: the token never reaches a real position
        else:
            chars = [BOW, *(b + 1 for b in token.encode("utf-8")[:max_chars - 2]), EOW]
        table[i, :len(chars)] = torch.tensor(chars, dtype=torch.int16)
    return table


class Highway(nn.Module):
    """Highway layers (Srivastava et al. 2015): ``x <- t * relu(W_H x + b_H) + (1 - t) * x``, ``t = sigmoid(W_T x +
    b_T)``, with b_T initialised to -2 so that each layer starts close to carrying its input (as bilm-tf does).

    State-dict keys: ``layers.{l}.weight`` / ``.bias`` (2D, D): the rows [0, D) are W_H, the rows [D, 2D) W_T.
    """

    def __init__(self, d: int, n_layers: int) -> None:
        super().__init__()
        self.d = d
        self.layers = nn.ModuleList(nn.Linear(d, 2 * d) for _ in range(n_layers))
        for layer in self.layers:
            with torch.no_grad():
                layer.bias[d:].fill_(-2.0)

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D)."""
        for layer in self.layers:
            h, t = layer(x).split(self.d, dim=-1)
            t = torch.sigmoid(t)
            x = t * F.relu(h) + (1.0 - t) * x
        return x


class CharCNN(nn.Module):
    """Token vectors from their characters: embeddings, convolutions of several widths max-pooled over time,
    highway layers and a linear projection (see the module docstring; Kim et al. 2016, Jozefowicz et al. 2016).

    State-dict keys: ``embeddings.weight`` (N_CHARS, E), ``convs.{i}.weight`` / ``.bias``, ``highway.*``,
    ``projection.weight`` / ``.bias``.
    """

    def __init__(self, d_char: int, filters: Sequence[Sequence[int]], n_highway: int, d_out: int) -> None:
        """
        Args:
            d_char: E.
            filters: (width, n_filters) pairs.
            n_highway: highway layers over the F concatenated features.
            d_out: D.
        """
        super().__init__()
        self.embeddings = nn.Embedding(N_CHARS, d_char, padding_idx=PAD_CHAR)
        self.widths = [int(w) for w, _ in filters]
        self.convs = nn.ModuleList(nn.Conv1d(d_char, int(n), int(w)) for w, n in filters)
        total = sum(int(n) for _, n in filters)
        self.highway = Highway(total, n_highway)
        self.projection = nn.Linear(total, d_out)

    def forward(self, chars: Tensor) -> Tensor:
        """
        Args:
            chars: (B, T, C) character ids, 0 = padding (after each token's characters).

        Returns:
            (B, T, D) token vectors.
        """
        B, T, C = chars.shape
        if C < max(self.widths):
            raise LmforgeError(f"tokens of {C} characters are narrower than the widest filter ({max(self.widths)})")
        chars = chars.reshape(B * T, C).long()
        lengths = (chars != PAD_CHAR).sum(-1)  # (N,)
        x = self.embeddings(chars).transpose(1, 2)  # (N, E, C)
        pooled = []
        for width, conv in zip(self.widths, self.convs, strict=True):
            y = conv(x)  # (N, n_w, C - w + 1)
            start = torch.arange(y.shape[-1], device=chars.device)  # (P,)
            valid = start <= (lengths - width).clamp(min=0).unsqueeze(-1)  # (N, P) windows starting in the token
            y = y.masked_fill(~valid.unsqueeze(1), float("-inf"))
            pooled.append(F.relu(y.max(dim=-1).values))  # (N, n_w)
        h = self.highway(torch.cat(pooled, dim=-1))  # (N, F)
        return self.projection(h).reshape(B, T, -1)  # (B, T, D)
