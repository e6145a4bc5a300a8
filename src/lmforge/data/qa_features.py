"""Extractive question answering data: sliding-window features, batching, and n-best span decoding.

BERT on SQuAD (Devlin et al. 2019, sections 4.2 and 4.3) reads ``[CLS] question [SEP] context [SEP]`` and
predicts the answer's first and last context tokens. A context longer than the window is cut into overlapping
windows ("doc spans"); every window is one model input (a *feature*), and the answers of all windows of a
question are compared at decoding time. This module follows Google's ``run_squad.py`` semantics:

- ``doc_stride`` is the distance, in context tokens, between the STARTS of consecutive windows (Google's
  ``--doc_stride``). Hugging Face's tokenizers call ``stride`` the number of tokens two windows SHARE instead;
  the two are related by ``hf_stride = window_capacity - doc_stride`` where
  ``window_capacity = max_length - question_tokens - 3``.
- A window that does not hold the whole answer (and every window of an unanswerable question) is labelled
  (0, 0), the [CLS] position.
- A token that sits in several windows is scored only in its "max-context" window, the one where it has the
  most context on its shorter side (``min(left, right) + 0.01 * window_length``, ties to the earlier window).
- The predicted text is cut from the ORIGINAL context with the tokens' character offsets, so it keeps the
  context's case, accents and spacing (Google's code re-aligns detokenised pieces to whitespace words instead).

Decoding deviates from ``run_squad.py`` in one named way: instead of pairing only the ``n_best`` highest start
and end logits of a window, it ranks every valid (start, end) pair exactly (vectorised over a band of
``max_answer_length`` ends per start). This finds every span the heuristic finds, never scores lower, and never
misses a valid span.

Examples are any objects with the attributes of ``lmforge.data.readers.QAExample`` (see ``QAExampleLike``).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from lmforge.errors import LmforgeError

__all__ = ["QAExampleLike", "collate_qa", "decode_qa", "featurize_qa", "window_spans"]

Span = tuple[int, int]


class QAExampleLike(Protocol):
    """What featurization and decoding read from an example (``lmforge.data.readers.QAExample`` fits).

    Attributes:
        id: unique question id (the key of the predictions).
        question: the question text.
        context: the paragraph; answers are character spans of it.
        answers: ``(text, answer_start)`` pairs, ``answer_start`` a character index into ``context``.
        is_impossible: SQuAD v2.0's unanswerable question (its ``answers`` are ignored).
    """

    @property
    def id(self) -> str: ...

    @property
    def question(self) -> str: ...

    @property
    def context(self) -> str: ...

    @property
    def answers(self) -> Sequence[tuple[str, int]]: ...

    @property
    def is_impossible(self) -> bool: ...


# ---------------------------------------------------------------------------------------------- featurization
def window_spans(n_tokens: int, capacity: int, doc_stride: int) -> list[Span]:
    """Google BERT's doc spans: ``(start, length)`` windows over ``n_tokens`` context tokens.

    Windows start at 0, ``doc_stride``, ``2 * doc_stride``... and hold up to ``capacity`` tokens; the last one
    ends at the last token. When ``doc_stride > capacity`` the step is cut to ``capacity`` (as Google's code
    does) so no token is ever skipped. An empty context gives one empty window, so every question has a feature.

    Args:
        n_tokens: context length in tokens (>= 0).
        capacity: the most context tokens a window holds (>= 1).
        doc_stride: distance between consecutive window starts (>= 1).

    Returns:
        The list of ``(start, length)``; their union is ``range(n_tokens)``.
    """
    assert capacity >= 1 and doc_stride >= 1 and n_tokens >= 0
    spans: list[Span] = []
    start = 0
    while True:
        length = min(n_tokens - start, capacity)
        spans.append((start, length))
        if start + length >= n_tokens:
            return spans
        start += min(length, doc_stride)


def _max_context_windows(spans: list[Span], n_tokens: int) -> list[int]:
    """For each context token, the index of the window where it has the most context (Google BERT's
    ``_check_is_max_context``: ``min(left, right) + 0.01 * length``, the first window wins a tie)."""
    best_window = [0] * n_tokens
    if len(spans) == 1:
        return best_window
    best_score = [-1.0] * n_tokens
    for w, (start, length) in enumerate(spans):
        bonus = 0.01 * length
        for j in range(length):
            score = min(j, length - 1 - j) + bonus
            if score > best_score[start + j]:
                best_score[start + j] = score
                best_window[start + j] = w
    return best_window


def _answer_tokens(example: Any, starts: list[int], ends: list[int]) -> Span | None:
    """The (first, last) context-token indices of the example's first answer, or None when impossible.

    First token: the first whose end is after the answer's start; last token: the last whose start is before
    the answer's end. Offsets grow along the text, so both are binary searches.
    """
    if example.is_impossible:
        return None
    if not example.answers:
        raise LmforgeError(f"QA example {example.id!r} has no answer and is not marked is_impossible; give it an "
                           "answer (text, answer_start) or set is_impossible=True")
    text, char_start = example.answers[0]
    char_end = char_start + len(text)
    context = example.context
    if not text or char_start < 0 or context[char_start:char_end] != text:
        raise LmforgeError(f"QA example {example.id!r}: the answer {text!r} does not match the context at "
                           f"answer_start={char_start} (the context there reads "
                           f"{context[max(char_start, 0):max(char_end, 0)]!r}); fix answer_start in the data")
    first = bisect_right(ends, char_start)
    last = bisect_left(starts, char_end) - 1
    if first > last:
        raise LmforgeError(f"QA example {example.id!r}: the answer {text!r} at answer_start={char_start} covers no "
                           "token of the context (only spaces or characters the tokenizer drops)")
    return first, last


def featurize_qa(examples: Sequence[QAExampleLike], tokenizer: Any, *, max_length: int = 384,
                 doc_stride: int = 128, max_query_length: int = 64, training: bool) -> list[dict[str, Any]]:
    """Turn questions with contexts into BERT inputs, one feature per sliding window of the context.

    Each context is tokenized once (``tokenizer.encode_text``, memoised per distinct context) and the windows
    are slices of it, so their tokens and offsets are exactly those of the whole context.

    Args:
        examples: objects with ``id, question, context, answers, is_impossible`` (see ``QAExampleLike``).
        tokenizer: a ``WordPieceTokenizer`` (uses ``encode_ids``, ``encode_text``, ``cls_id``, ``sep_id``).
        max_length: tokens per feature, special tokens included (BERT 384).
        doc_stride: distance between the starts of consecutive windows, in context tokens (Google's
            ``--doc_stride``, BERT 128; NOT Hugging Face's overlap ``stride``, see the module docstring).
        max_query_length: the question is cut to this many tokens (BERT 64).
        training: add the labels ``start_position`` / ``end_position``.

    Returns:
        One dict per window, in example order, with lists of length L (the feature's length):

        - ``input_ids``: ``[CLS] question [SEP] window [SEP]``; ``token_type_ids``: 0 up to the first [SEP], 1 after.
        - ``context_mask``: 1 at [CLS] and at this window's context tokens, 0 elsewhere (where an answer may lie).
        - ``offsets``: ``(start, end)`` characters of the context for context tokens, None elsewhere.
        - ``token_is_max_context``: True at the context tokens this window scores (each context token is True
          in exactly one window).
        - ``example_index`` (position in ``examples``), ``example_id``, ``context_start`` (index of the first
          context token in ``input_ids``), ``window_start`` (index of that token in the tokenized context).
        - with ``training``: ``start_position``, ``end_position``, token indices in ``input_ids`` of the first
          answer's first and last tokens, or (0, 0) when the window does not hold the whole answer or the
          question is impossible.

    Raises:
        LmforgeError: a bad option, a window with no room for the context, or an answer that does not match its
            context.
    """
    for name, value in (("max_length", max_length), ("doc_stride", doc_stride),
                        ("max_query_length", max_query_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LmforgeError(f"featurize_qa: {name} must be a positive integer, got {value!r}")
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    contexts: dict[str, tuple] = {}  # context text -> (ids, offsets, starts, ends)
    features: list[dict[str, Any]] = []
    for index, example in enumerate(examples):
        question_ids = tokenizer.encode_ids(example.question)[:max_query_length]
        tokenized = contexts.get(example.context)
        if tokenized is None:
            ids, offsets, _ = tokenizer.encode_text(example.context)
            tokenized = (ids, offsets, [s for s, _ in offsets], [e for _, e in offsets])
            contexts[example.context] = tokenized
        context_ids, context_offsets, starts, ends = tokenized
        capacity = max_length - len(question_ids) - 3
        if capacity < 1:
            raise LmforgeError(f"featurize_qa: max_length={max_length} leaves no room for the context of question "
                               f"{example.id!r} ({len(question_ids)} question tokens + 3 special tokens); raise "
                               f"max_length above {len(question_ids) + 3} or lower max_query_length")
        spans = window_spans(len(context_ids), capacity, doc_stride)
        max_context = _max_context_windows(spans, len(context_ids))
        answer = _answer_tokens(example, starts, ends) if training else None
        prefix = [cls_id, *question_ids, sep_id]
        c0 = len(prefix)
        for w, (start, length) in enumerate(spans):
            stop = start + length
            feature: dict[str, Any] = {
                "input_ids": [*prefix, *context_ids[start:stop], sep_id],
                "token_type_ids": [0] * c0 + [1] * (length + 1),
                "context_mask": [1] + [0] * (c0 - 1) + [1] * length + [0],
                "offsets": [None] * c0 + context_offsets[start:stop] + [None],
                "token_is_max_context": [False] * c0 + [max_context[i] == w for i in range(start, stop)] + [False],
                "example_index": index,
                "example_id": example.id,
                "context_start": c0,
                "window_start": start,
            }
            if training:
                inside = answer is not None and start <= answer[0] and answer[1] < stop
                feature["start_position"] = c0 + answer[0] - start if inside else 0
                feature["end_position"] = c0 + answer[1] - start if inside else 0
            features.append(feature)
    return features


def collate_qa(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, Tensor]:
    """Pad features (right) into one batch for ``TaskModel(encoder, QuestionAnsweringHead)``.

    Args:
        features: dicts from ``featurize_qa``; ``example_index`` and ``offsets`` stay out of the batch (keep the
            feature list for ``decode_qa``).
        pad_id: the padding token id (``tokenizer.pad_id``).

    Returns:
        ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids``: (B, T) int64; ``context_mask``
        (B, T) bool; and ``start_positions``, ``end_positions`` (B,) int64 when the features carry labels. The
        dict can be passed to the model as keyword arguments.
    """
    if not features:
        raise LmforgeError("collate_qa got no features")
    B = len(features)
    T = max(len(f["input_ids"]) for f in features)
    input_ids = np.full((B, T), pad_id, dtype=np.int64)
    attention_mask = np.zeros((B, T), dtype=np.int64)
    token_type_ids = np.zeros((B, T), dtype=np.int64)
    context_mask = np.zeros((B, T), dtype=np.bool_)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        input_ids[i, :n] = f["input_ids"]
        attention_mask[i, :n] = 1
        token_type_ids[i, :n] = f["token_type_ids"]
        context_mask[i, :n] = f["context_mask"]
    batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
             "token_type_ids": torch.from_numpy(token_type_ids), "context_mask": torch.from_numpy(context_mask)}
    labelled = sum("start_position" in f for f in features)
    if labelled == B:
        batch["start_positions"] = torch.tensor([f["start_position"] for f in features], dtype=torch.long)
        batch["end_positions"] = torch.tensor([f["end_position"] for f in features], dtype=torch.long)
    elif labelled:
        raise LmforgeError(f"collate_qa: {labelled} of {B} features have labels; featurize all of them with the "
                           "same training= setting")
    return batch


# ---------------------------------------------------------------------------------------------- decoding
def _logit_row(row: Any, length: int, what: str, index: int) -> np.ndarray:
    """One feature's logits as float64 (float64 keeps the sum of two float32 minima finite)."""
    if hasattr(row, "detach"):  # a torch tensor (possibly bf16, on a device, with grad)
        row = row.detach().float().cpu().numpy()
    values = np.asarray(row, dtype=np.float64)
    if values.ndim != 1 or values.shape[0] < length:
        raise LmforgeError(f"decode_qa: {what}[{index}] has shape {values.shape}; it needs one logit per token of "
                           f"feature {index} (at least {length})")
    values = values[:length]
    if not (values < np.inf).all():  # NaN compares False too
        raise LmforgeError(f"decode_qa: {what}[{index}] holds NaN or +inf; logits must be finite (-inf forbids a "
                           "position)")
    return values


def _window_spans(feature: dict[str, Any], start: np.ndarray, end: np.ndarray, n_best: int,
                  max_answer_length: int) -> list[tuple[float, float, float, int, int]]:
    """The ``n_best`` highest-scoring valid spans of one window as ``(score, start_logit, end_logit, char_start,
    char_end)``: start and end are context tokens of this window, start <= end < start + max_answer_length, and
    the start token is scored in this window (its max-context window).

    The window's context is the contiguous run of ``L`` tokens after ``context_start``, closed by [SEP] (the layout
    ``featurize_qa`` writes); spans are a band of (L, K) start-end pairs, K = min(max_answer_length, L).
    """
    c0 = feature["context_start"]
    L = len(feature["input_ids"]) - c0 - 1
    if L <= 0:
        return []
    s, e = start[c0:c0 + L], end[c0:c0 + L]  # (L,) each
    can_start = np.asarray(feature["token_is_max_context"][c0:c0 + L], dtype=np.bool_)  # (L,)
    K = min(max_answer_length, L)
    ends = np.arange(L)[:, None] + np.arange(K)  # (L, K) end index of the span (p, p + k)
    inside = ends < L  # (L, K)
    scores = (s[:, None] + e[np.minimum(ends, L - 1)]).ravel()  # (L * K,)
    # A -inf logit forbids its position (as a masked one would).
    valid = np.flatnonzero((can_start[:, None] & inside).ravel() & (scores > -np.inf))  # (N,)
    if valid.size > n_best:
        valid = valid[np.argpartition(-scores[valid], n_best - 1)[:n_best]]
    offsets = feature["offsets"]
    out = []
    for i in valid.tolist():
        p, k = divmod(i, K)
        out.append((float(scores[i]), float(s[p]), float(e[p + k]), offsets[c0 + p][0], offsets[c0 + p + k][1]))
    return out


def _softmax(scores: list[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def decode_qa(examples: Sequence[QAExampleLike], features: Sequence[dict[str, Any]], start_logits: Sequence[Any],
              end_logits: Sequence[Any], *, n_best: int = 20, max_answer_length: int = 30, version_2: bool = False,
              null_threshold: float = 0.0) -> dict[str, dict[str, Any]]:
    """Pick each question's answer from the start and end logits of all its windows (Devlin et al. 2019, 4.2-4.3).

    A span (i, j) of a window scores ``start_logits[i] + end_logits[j]``; it is valid when i and j are context
    tokens of that window, ``i <= j < i + max_answer_length``, and the window is i's max-context window. The
    ``n_best`` highest valid spans over all windows are ranked exactly (see the module docstring).

    SQuAD v2.0 (``version_2=True``): the null score is the minimum over the question's windows of
    ``start_logits[CLS] + end_logits[CLS]`` (Google's choice); the answer is "" when
    ``null_score - best_span_score > null_threshold`` or no valid span exists. v1.1: the best valid span is always
    returned; only a question with no valid span at all (an empty context) gets "".

    Args:
        examples: the examples given to ``featurize_qa`` (same order; ``example_index`` points into it).
        features: the features it returned (any order, any subset of windows).
        start_logits: one row per feature: a 1-D sequence, array or tensor of at least the feature's length (rows
            of a padded batch are fine; positions past the feature's length are ignored), or a 2-D array.
        end_logits: the same for span ends.
        n_best: how many spans to keep per question (>= 1).
        max_answer_length: the longest answer in tokens (>= 1).
        version_2: allow the null answer.
        null_threshold: the margin by which the null must beat the best span (tune on dev data).

    Returns:
        ``{example id: prediction}``; a prediction has ``text`` (cut from the original context), ``start`` and
        ``end`` (its character span, end exclusive: ``context[start:end] == text``; 0 and 0 for ""), ``score``
        (span score, or the null score when the null is predicted; None when there is no valid span in v1.1),
        ``n_best`` (the ranked spans as dicts with ``text, start, end, score, start_logit, end_logit,
        probability``; in v2.0 also the null entry; ``probability`` is a softmax over the listed scores) and, in
        v2.0, ``null_score``.

    Raises:
        LmforgeError: lengths disagree, a feature points to no example or to another example's id, logits are
            too short or NaN, or an option is out of range.
    """
    if n_best < 1 or max_answer_length < 1:
        raise LmforgeError(f"decode_qa needs n_best >= 1 and max_answer_length >= 1; got n_best={n_best}, "
                           f"max_answer_length={max_answer_length}")
    examples = list(examples)
    if len(start_logits) != len(features) or len(end_logits) != len(features):
        raise LmforgeError(f"decode_qa got {len(features)} features but {len(start_logits)} start and "
                           f"{len(end_logits)} end logit rows; pass one row per feature, in the same order")
    windows: list[list[int]] = [[] for _ in examples]
    for i, feature in enumerate(features):
        index = feature["example_index"]
        if not 0 <= index < len(examples):
            raise LmforgeError(f"decode_qa: feature {i} belongs to example {index}, but only {len(examples)} "
                               "examples were given; pass the examples list given to featurize_qa")
        if feature.get("example_id", examples[index].id) != examples[index].id:
            raise LmforgeError(f"decode_qa: feature {i} was made for question {feature['example_id']!r} but "
                               f"example {index} is {examples[index].id!r}; pass the examples list given to "
                               "featurize_qa, in the same order")
        windows[index].append(i)
    predictions: dict[str, dict[str, Any]] = {}
    for index, example in enumerate(examples):
        if example.id in predictions:
            raise LmforgeError(f"decode_qa: the question id {example.id!r} occurs twice; ids must be unique")
        spans: list[tuple[float, float, float, int, int]] = []
        null_score, null_logits = math.inf, (0.0, 0.0)
        for i in windows[index]:
            feature = features[i]
            length = len(feature["input_ids"])
            start = _logit_row(start_logits[i], length, "start_logits", i)
            end = _logit_row(end_logits[i], length, "end_logits", i)
            if start[0] + end[0] < null_score:
                null_score, null_logits = float(start[0] + end[0]), (float(start[0]), float(end[0]))
            spans.extend(_window_spans(feature, start, end, n_best, max_answer_length))
        spans.sort(key=lambda s: (-s[0], s[3], s[4]))  # best first; ties by position, for determinism
        context = example.context
        entries = [{"text": context[cs:ce], "start": cs, "end": ce, "score": score, "start_logit": sl,
                    "end_logit": el} for score, sl, el, cs, ce in spans[:n_best]]
        best = entries[0] if entries else None
        prediction: dict[str, Any]
        if version_2:
            null = {"text": "", "start": 0, "end": 0, "score": null_score, "start_logit": null_logits[0],
                    "end_logit": null_logits[1]}
            if not windows[index]:
                null["score"] = None
            elif best is None or null_score - best["score"] > null_threshold:
                best = null
            entries = sorted([*entries, null], key=lambda e: -math.inf if e["score"] is None else -e["score"])
        if best is None:
            prediction = {"text": "", "start": 0, "end": 0, "score": None}
        else:
            prediction = {"text": best["text"], "start": best["start"], "end": best["end"], "score": best["score"]}
        scored = [e for e in entries if e["score"] is not None]
        for e, p in zip(scored, _softmax([e["score"] for e in scored]), strict=True):
            e["probability"] = p
        prediction["n_best"] = entries
        if version_2:
            prediction["null_score"] = null_score if windows[index] else None
        predictions[example.id] = prediction
    return predictions
