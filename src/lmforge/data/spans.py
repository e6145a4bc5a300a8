"""Enumerating the candidate spans of a sentence, shared by span featurization (``data.token_features``) and the
span-classification head (``heads.span``)."""

from __future__ import annotations

from lmforge.errors import LmforgeError


def enumerate_spans(n_words: int, max_span_width: int) -> list[tuple[int, int]]:
    """All spans (i, j), 0 <= i <= j < n_words, j - i + 1 <= max_span_width, with j INCLUSIVE, ordered by j
    then i (so the list for n words is a prefix of the list for n + 1 words)."""
    if max_span_width < 1:
        raise LmforgeError(f"max_span_width must be >= 1, got {max_span_width}")
    return [(i, j) for j in range(n_words) for i in range(max(0, j - max_span_width + 1), j + 1)]


def count_spans(n_words: int, max_span_width: int) -> int:
    """``len(enumerate_spans(n_words, max_span_width))`` = m n - m (m - 1) / 2 with m = min(n, max width)."""
    m = min(n_words, max_span_width)
    return m * n_words - m * (m - 1) // 2
