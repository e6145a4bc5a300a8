"""Masking strategies for masked-language-model pretraining, over numpy arrays with a passed-in generator.

* ``"token"`` — BERT (Devlin et al., 2019, section 3.1 and appendix A.1; google-research/bert
  ``create_pretraining_data.py``): choose ``round(mask_prob * n_candidates)`` positions (at least 1, at most
  ``max_predictions``) uniformly among the non-special tokens; each chosen token independently becomes
  ``[MASK]`` (80%), a random token (10%) or stays unchanged (10%).
* ``"whole_word"`` — BERT's whole-word masking (google-research/bert README, 2019-05-31): a word is a piece
  plus the ``##`` pieces after it; words are visited in random order and taken whole while they fit in the
  budget (a word that would overshoot is skipped, as in BERT); every piece of a taken word is predicted and
  gets its own 80/10/10 draw.
* ``"span"`` — SpanBERT (Joshi et al., 2020, section 3.1): span lengths in *words* are drawn from a geometric
  distribution ``Geo(p = span_p)`` clipped at ``max_span_len`` (truncated and renormalised: with p = 0.2 and
  10 this has the paper's mean length of 3.8 words), each span starts at a uniformly random word, and spans
  are drawn until the budget of tokens is covered. The 80/10/10 decision is made once per span: all its tokens
  become ``[MASK]``, all become random tokens, or all stay. For each predicted token the span boundary
  positions (the token just before and just after the span) and its 0-based offset inside the span are
  returned for the span boundary objective (SBO).
* ``"ngram"`` — ALBERT's n-gram masking (Lan et al., 2020, section 4.1; google-research/albert's
  create_pretraining_data.py): n-grams of up to ``max_ngram`` (3) whole words, n drawn with p(n) proportional to
  1/n, placed like SpanBERT's spans (no overlap, within one segment), until the budget is covered; the 80/10/10
  decision is made per token, as that code does. Deviations: n-grams never touch one another (shared with
  ``span``; the released code only forbids overlap), and the last n-gram is trimmed to the budget where the
  released code tries shorter ones and skips it if none fits.

Budget: ``round(mask_prob * n)`` where ``n`` counts the candidate (non-special, non-padding) tokens.
Deviation: BERT's code counts every token of the sequence, [CLS] and [SEP] included (a pair of length 128 gets
19 predictions either way; the counts differ by at most one). Special tokens (any id of the tokenizer's special set:
[CLS], [SEP], [PAD], [MASK], [UNK], ...) are never chosen.

Random replacements are drawn uniformly from the *non-special* vocabulary. Deviation: BERT draws from the whole
vocabulary, which can put a [CLS], [SEP] or [PAD] inside the text.

Span details, where the paper is silent (decisions follow SpanBERT's released code unless noted):

* The span-boundary objective predicts at most the first ``sbo_positions`` tokens (word pieces) of a span
  (default ``max_span_len``: the rows of ``SpanBoundaryHead``'s relative-position table, indexed by the token's
  offset inside its span). Spans are drawn in words, so a span of up to ``max_span_len`` words can hold more
  pieces than that; its later tokens are still predicted by the MLM but get no SBO target (``sbo_left`` =
  ``sbo_right`` = -1 there). This is what SpanBERT's released code does: its pair targets (the SBO's tokens)
  are truncated to ``max_pair_targets`` pieces (``pad_to_len``) while the spans are measured in words. Why not
  a table sized by the longest span in pieces: it would change the saved head's shape (existing span-head
  checkpoints and their optimizer state would no longer load), and its rows past the usual span lengths would
  hardly be trained; why not capping spans in pieces: that would shorten the spans in words and break the
  paper's Geo(0.2) length law (by 0.07 in total variation on text with 1.4 pieces per word).
* The last span is trimmed to the budget, so exactly ``budget`` tokens are predicted (the released code stops
  adding tokens at the budget); the number of predictions never exceeds ``max_predictions``.
* Spans never overlap and never touch (the words just before and after a span stay unmasked), so each span's
  boundary tokens are observed. Deviation: the released code merges touching spans into one.
* A span never crosses a special token (a [SEP] between two segments); its start is drawn uniformly among the
  words where a span of the drawn length fits. If none fits, the length is lowered to the longest that fits
  (rare: only when little unmasked text is left).
* The sequence's first and last positions are never in a span (they need an outside boundary); in BERT inputs
  they are [CLS] and [SEP] anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmforge.choices import MASKINGS
from lmforge.errors import LmforgeError

__all__ = [
    "IGNORE_INDEX", "STRATEGIES", "MaskedExample", "continuation_mask", "mask_budget", "mask_tokens",
    "span_length_pmf", "word_start_mask",
]

IGNORE_INDEX = -100
STRATEGIES = MASKINGS


@dataclass
class MaskedExample:
    """A masked sequence and its prediction targets. All arrays are (T,) int64 unless noted.

    Attributes:
        input_ids: the corrupted input.
        labels: the original id at predicted positions, ``-100`` elsewhere.
        sbo_left, sbo_right: span masking only; index of the token just before / just after the span that holds
            each predicted token, ``-1`` where no prediction and where the token has no SBO target (offset
            ``>= sbo_positions``).
        sbo_offset: span masking only; the token's 0-based position inside its span, ``0`` where no SBO target.
        spans: span masking only; (n_spans, 2) token ranges ``[start, end)`` of the spans, in drawing order.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    sbo_left: np.ndarray | None = None
    sbo_right: np.ndarray | None = None
    sbo_offset: np.ndarray | None = None
    spans: np.ndarray | None = None


def continuation_mask(tokenizer) -> np.ndarray:
    """(vocab_size,) bool: True for WordPiece continuation pieces (tokens that start with ``##``)."""
    return np.array([t is not None and t.startswith("##") for t in tokenizer.ids_to_tokens], dtype=bool)


def word_start_mask(ids: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    """(T,) bool: True where a token starts a word (is not a ``##`` continuation piece)."""
    return ~continuation[np.asarray(ids)]


def span_length_pmf(span_p: float, max_span_len: int) -> np.ndarray:
    """P(length = 1..max_span_len) of SpanBERT's clipped geometric: ``p (1-p)^(l-1)``, renormalised."""
    lengths = np.arange(1, max_span_len + 1)
    pmf = span_p * (1.0 - span_p) ** (lengths - 1)
    return pmf / pmf.sum()


def ngram_length_pmf(max_ngram: int) -> np.ndarray:
    """P(n = 1..max_ngram) of ALBERT's n-gram masking: proportional to 1/n (3: 6/11, 3/11, 2/11)."""
    pmf = 1.0 / np.arange(1, max_ngram + 1)
    return pmf / pmf.sum()


def mask_budget(n_candidates: int, mask_prob: float, max_predictions: int) -> int:
    """Tokens to predict: ``round(mask_prob * n_candidates)``, at least 1 (when mask_prob > 0 and there is a
    candidate) and at most ``max_predictions``."""
    if n_candidates <= 0 or mask_prob <= 0:
        return 0
    return int(min(max_predictions, n_candidates, max(1, round(mask_prob * n_candidates))))


def mask_tokens(ids: np.ndarray, *, special_mask: np.ndarray, vocab_size: int, non_special_ids: np.ndarray,
                mask_id: int, rng: np.random.Generator, mask_prob: float = 0.15, max_predictions: int = 20,
                mask_token_ratio: float = 0.8, random_token_ratio: float = 0.1, strategy: str = "token",
                word_starts: np.ndarray | None = None, span_p: float = 0.2,
                max_span_len: int = 10, sbo_positions: int | None = None, max_ngram: int = 3) -> MaskedExample:
    """Choose tokens to predict and corrupt them (see the module docstring for each strategy).

    Args:
        ids: (T,) token ids of one sequence, special tokens and padding included.
        special_mask: (T,) bool, True at special and padding tokens (never chosen).
        vocab_size: V; every id must be below it.
        non_special_ids: the ids random replacements are drawn from (uniformly).
        mask_id: the id of [MASK].
        rng: the generator every random choice draws from.
        mask_prob: share of candidate tokens to predict (BERT 0.15).
        max_predictions: cap on predicted tokens per sequence (BERT 20 at length 128, 76 at 512).
        mask_token_ratio: share of predicted tokens (spans) replaced by [MASK] (0.8).
        random_token_ratio: share replaced by a random token (0.1); the rest stay unchanged.
        strategy: ``"token"``, ``"whole_word"``, ``"span"`` or ``"ngram"``.
        word_starts: (T,) bool, True where a token starts a word (``word_start_mask``); needed by
            ``whole_word`` and ``span`` (``None``: every token is a word).
        span_p: p of the geometric span length (SpanBERT 0.2).
        max_span_len: longest span in words (SpanBERT 10).
        sbo_positions: span masking only; tokens at offsets ``>= sbo_positions`` inside their span get no SBO
            target (``None``: ``max_span_len``, the rows of ``SpanBoundaryHead``'s position table).
        max_ngram: ``ngram`` masking only: the longest n-gram in words (ALBERT 3).

    Returns:
        A ``MaskedExample``; ``sbo_*`` and ``spans`` are set for ``strategy="span"`` only.
    """
    ids = np.asarray(ids, dtype=np.int64)
    special_mask = np.asarray(special_mask, dtype=bool)
    if ids.ndim != 1 or special_mask.shape != ids.shape:
        raise LmforgeError(f"mask_tokens takes one sequence: ids {ids.shape} and special_mask "
                           f"{special_mask.shape} must be the same 1-D shape")
    if strategy not in STRATEGIES:
        raise LmforgeError(f"masking strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise LmforgeError(f"token ids must be in [0, {vocab_size}); got {ids.min()}..{ids.max()}")
    if mask_token_ratio + random_token_ratio > 1.0 + 1e-9:
        raise LmforgeError("mask_token_ratio + random_token_ratio must not exceed 1")
    if word_starts is None:
        word_starts = np.ones(ids.shape, dtype=bool)
    elif np.shape(word_starts) != ids.shape:
        raise LmforgeError(f"word_starts {np.shape(word_starts)} must have the shape of ids {ids.shape}")
    candidates = ~special_mask
    if strategy == "span" and ids.size:
        candidates[0] = candidates[-1] = False  # a span needs a boundary token on both sides
    budget = mask_budget(int(candidates.sum()), mask_prob, max_predictions)
    out = ids.copy()
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    non_special_ids = np.asarray(non_special_ids, dtype=np.int64)

    def replace(positions: np.ndarray, draws: np.ndarray) -> None:
        """Apply the 80/10/10 rule: ``draws`` in [0, 1) per position (shared by a span's tokens)."""
        labels[positions] = ids[positions]
        to_mask = positions[draws < mask_token_ratio]
        to_random = positions[(draws >= mask_token_ratio) & (draws < mask_token_ratio + random_token_ratio)]
        out[to_mask] = mask_id
        if len(to_random):
            out[to_random] = non_special_ids[rng.integers(len(non_special_ids), size=len(to_random))]

    if strategy == "span":
        sbo_left = np.full(ids.shape, -1, dtype=np.int64)
        sbo_right = np.full(ids.shape, -1, dtype=np.int64)
        sbo_offset = np.zeros(ids.shape, dtype=np.int64)
        sbo_cap = max_span_len if sbo_positions is None else int(sbo_positions)
        if sbo_cap < 1:
            raise LmforgeError(f"sbo_positions={sbo_positions} must be >= 1")
        spans = _draw_spans(candidates, np.asarray(word_starts, dtype=bool), budget,
                            span_length_pmf(span_p, max_span_len), rng)
        for start, end in spans:
            positions = np.arange(start, end)
            replace(positions, np.full(len(positions), rng.random()))
            sbo = positions[:sbo_cap]  # the SBO predicts the first sbo_cap pieces of a span (SpanBERT's code)
            sbo_left[sbo] = start - 1
            sbo_right[sbo] = end
            sbo_offset[sbo] = sbo - start
        return MaskedExample(out, labels, sbo_left, sbo_right, sbo_offset,
                             np.asarray(spans, dtype=np.int64).reshape(-1, 2))

    positions = np.flatnonzero(candidates)
    if strategy == "token":
        chosen = np.sort(rng.choice(positions, size=budget, replace=False)) if budget else positions[:0]
    elif strategy == "ngram":
        if max_ngram < 1:
            raise LmforgeError(f"max_ngram={max_ngram} must be >= 1")
        spans = _draw_spans(candidates, np.asarray(word_starts, dtype=bool), budget, ngram_length_pmf(max_ngram), rng)
        chosen = np.sort(np.concatenate([np.arange(s, e) for s, e in spans])) if spans else positions[:0]
    else:
        chosen = _choose_whole_words(positions, np.asarray(word_starts, dtype=bool), budget, rng)
    replace(chosen, rng.random(len(chosen)))
    return MaskedExample(out, labels)


def _words(positions: np.ndarray, word_starts: np.ndarray) -> np.ndarray:
    """Index (into ``positions``) of the first piece of each word; a piece after a gap starts a word."""
    starts = word_starts[positions].copy()
    if len(positions):
        starts[0] = True
        starts[1:] |= positions[1:] != positions[:-1] + 1
    return np.flatnonzero(starts)


def _choose_whole_words(positions: np.ndarray, word_starts: np.ndarray, budget: int,
                        rng: np.random.Generator) -> np.ndarray:
    first = _words(positions, word_starts)
    bounds = np.append(first, len(positions))
    chosen: list[np.ndarray] = []
    covered = 0
    for w in rng.permutation(len(first)):
        if covered >= budget:
            break
        size = bounds[w + 1] - bounds[w]
        if covered + size > budget:
            continue  # BERT skips a word that would overshoot and tries the next
        chosen.append(positions[bounds[w]:bounds[w + 1]])
        covered += size
    return np.sort(np.concatenate(chosen)) if chosen else positions[:0]


def _draw_spans(candidates: np.ndarray, word_starts: np.ndarray, budget: int, pmf: np.ndarray,
                rng: np.random.Generator) -> list[tuple[int, int]]:
    positions = np.flatnonzero(candidates)
    if budget <= 0 or not len(positions):
        return []
    first = _words(positions, word_starts)
    n_words = len(first)
    word_start = positions[first]  # token index where each word starts
    word_end = np.append(positions[first[1:] - 1], positions[-1]) + 1  # one past its last piece
    gaps = np.ones(len(positions), dtype=bool)
    gaps[1:] = positions[1:] != positions[:-1] + 1
    run = (np.cumsum(gaps) - 1)[first]  # contiguous stretch (between special tokens) of each word
    same_run_next = np.append(run[1:] == run[:-1], False)  # word k and k+1 are adjacent
    masked = np.zeros(n_words, dtype=bool)
    spans: list[tuple[int, int]] = []
    covered = 0
    lengths = np.arange(1, len(pmf) + 1)
    while covered < budget:
        length = int(rng.choice(lengths, p=pmf))
        blocked = masked.copy()
        blocked[1:] |= masked[:-1] & same_run_next[:-1]
        blocked[:-1] |= masked[1:] & same_run_next[:-1]
        free = np.concatenate([[0], np.cumsum(~blocked)])
        good = None
        while length >= 1:
            starts = np.arange(max(n_words - length + 1, 0))
            ok = (free[starts + length] - free[starts] == length) & (run[starts] == run[starts + length - 1])
            if ok.any():
                good = np.flatnonzero(ok)
                break
            length -= 1
        if good is None:
            break  # no unmasked word left that a span can take
        w = int(good[rng.integers(len(good))])
        start, end = int(word_start[w]), int(word_end[w + length - 1])
        end = min(end, start + budget - covered)  # trim the last span to the budget
        masked[w:w + length] = True
        spans.append((start, end))
        covered += end - start
    return spans
