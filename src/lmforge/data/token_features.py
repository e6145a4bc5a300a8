"""Model features for word-level tasks: tagging (``lmforge.heads.token``) and span labeling
(``lmforge.heads.span``), and the collate functions that pad them into batches.

A sentence is a list of words (pre-split, e.g. CoNLL tokens). Each word is split into sub-words by
``tokenizer.encode_ids(word)``; a word that yields none (e.g. a lone control character) becomes ``[UNK]``, so
every word has at least one position. The input is ``[CLS] pieces [SEP]`` (token types all 0).

Truncation keeps whole words only: the words that do not fit in ``max_length`` (with [CLS] and [SEP]) are left
out (``n_words`` < ``n_words_total``); the featurizers return how many sentences lost words, for the caller to
warn about. The batch dicts of the collate functions hold exactly the keyword arguments of
``TaskModel(backbone, head)`` for the matching head, so ``model(**batch)`` works.

Label ids: ``label_to_id`` maps a label to its index in the head's ``labels`` list. Tagging uses that id;
span labeling uses class ``id + 1`` (class 0 = "none", no span).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lmforge.data.spans import enumerate_spans
from lmforge.errors import LmforgeError

__all__ = ["collate_spans", "collate_tagging", "featurize_spans", "featurize_tagging", "split_words"]

IGNORE_INDEX = -100
SUBWORD_MODES = ("first", "all")


def split_words(words: Sequence[str], tokenizer: Any, max_length: int) -> tuple[list[list[int]], int]:
    """Sub-word ids of each word, and how many words fit in ``max_length`` with [CLS] and [SEP].

    Args:
        words: the sentence's words.
        tokenizer: a ``WordPieceTokenizer`` (uses ``encode_ids`` and ``unk_id``), or a tokenizer whose tokens carry
            the space before a word (``words_need_spaces``: byte-level BPE), whose words after the first are then
            encoded with that space, as the sentence written out would be (Hugging Face's ``add_prefix_space``
            gives every word one; GPT-2 and RoBERTa saw a sentence's first word without).
        max_length: the limit in tokens, specials included (>= 2).

    Returns:
        (pieces of every word — never empty —, number of leading words that fit).
    """
    spaced = bool(getattr(tokenizer, "words_need_spaces", False))
    pieces = [tokenizer.encode_ids(" " + w if spaced and i else w) or [tokenizer.unk_id] for i, w in enumerate(words)]
    budget, kept = max_length - 2, 0
    for p in pieces:
        if len(p) > budget:
            break
        budget -= len(p)
        kept += 1
    return pieces, kept


def _check_common(max_length: int, label_to_id: Mapping[str, int] | None) -> None:
    if max_length < 2:
        raise LmforgeError(f"max_length must be >= 2 ([CLS] and [SEP]); got {max_length}")
    if label_to_id is not None and not isinstance(label_to_id, Mapping):
        raise LmforgeError(f"label_to_id must be a dict {{label: id}}; got {type(label_to_id).__name__}")


def _label_id(label: str, label_to_id: Mapping[str, int], index: int) -> int:
    found = label_to_id.get(label)
    if found is None:
        raise LmforgeError(f"sentence {index}: label {label!r} never appears in the training data (known: "
                           f"{', '.join(sorted(label_to_id))}); relabel it or train with it")
    return found


def _inputs(pieces: list[list[int]], kept: int, tokenizer: Any) -> tuple[list[int], list[int]]:
    """[CLS] pieces of the kept words [SEP], and the position of each kept word's first piece."""
    ids, starts = [tokenizer.cls_id], []
    for p in pieces[:kept]:
        starts.append(len(ids))
        ids.extend(p)
    ids.append(tokenizer.sep_id)
    return ids, starts


# ---------------------------------------------------------------------------------------------- tagging
def featurize_tagging(sentences: Sequence[tuple[Sequence[str], Sequence[str] | None]], tokenizer: Any,
                      label_to_id: Mapping[str, int] | None, max_length: int,
                      subwords: str = "first") -> tuple[list[dict[str, Any]], int]:
    """Tagged (or untagged) sentences -> features for ``TokenClassificationHead``.

    Args:
        sentences: (words, tags) pairs; tags is None for prediction. Labels are made when both the tags and
            ``label_to_id`` are given.
        tokenizer: a ``WordPieceTokenizer``.
        label_to_id: {tag: id}, the head's label order.
        max_length: tokens per input, [CLS] and [SEP] included.
        subwords: "first" (labels on first sub-words, the word-level ``labels``) or "all" (also
            ``subword_labels``: every sub-word gets its word's label unchanged; see ``lmforge.heads.token``).

    Returns:
        (features, number of truncated sentences). A feature holds ``input_ids``, ``token_type_ids``,
        ``word_index`` (word of each position, -1 at [CLS]/[SEP]), ``n_words`` (words kept),
        ``n_words_total``, and with tags ``labels`` (one id per kept word) and, for ``subwords="all"``,
        ``subword_labels`` (per position, -100 at [CLS]/[SEP]).

    Raises:
        LmforgeError: a tag missing from ``label_to_id`` (naming the tag and the sentence index), tags and words
            of different lengths, a bad option.
    """
    _check_common(max_length, label_to_id)
    if subwords not in SUBWORD_MODES:
        raise LmforgeError(f"unknown subwords={subwords!r}; choose one of {', '.join(SUBWORD_MODES)}")
    features, n_truncated = [], 0
    for index, (words, tags) in enumerate(sentences):
        pieces, kept = split_words(words, tokenizer, max_length)
        n_truncated += kept < len(words)
        ids, _ = _inputs(pieces, kept, tokenizer)
        word_index = [-1] + [w for w in range(kept) for _ in pieces[w]] + [-1]
        feature: dict[str, Any] = {"input_ids": ids, "token_type_ids": [0] * len(ids), "word_index": word_index,
                                   "n_words": kept, "n_words_total": len(words)}
        if tags is not None and label_to_id is not None:
            if len(tags) != len(words):
                raise LmforgeError(f"sentence {index} has {len(words)} words but {len(tags)} tags")
            tag_ids = [_label_id(t, label_to_id, index) for t in tags]  # all tags: an unknown one is an error
            feature["labels"] = tag_ids[:kept]
            if subwords == "all":
                feature["subword_labels"] = [IGNORE_INDEX] + [tag_ids[w] for w in word_index[1:-1]] + [IGNORE_INDEX]
        features.append(feature)
    return features, n_truncated


def _pad(rows: Sequence[Sequence[int]], width: int, fill: int) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=np.int64)
    for b, row in enumerate(rows):
        out[b, :len(row)] = row
    return out


def _collate_inputs(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, np.ndarray]:
    if not features:
        raise LmforgeError("cannot collate an empty batch")
    T = max(len(f["input_ids"]) for f in features)
    ids = [f["input_ids"] for f in features]
    return {"input_ids": _pad(ids, T, pad_id), "attention_mask": _pad([[1] * len(r) for r in ids], T, 0),
            "token_type_ids": _pad([f["token_type_ids"] for f in features], T, 0)}


def _optional(features: Sequence[dict[str, Any]], key: str) -> bool:
    present = sum(key in f for f in features)
    if present not in (0, len(features)):
        raise LmforgeError(f"{present} of {len(features)} features in the batch have {key!r}; labelled and "
                           "unlabelled sentences cannot share a batch")
    return present > 0


def collate_tagging(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad tagging features into a batch.

    Returns:
        ``input_ids`` (B, T) padded with ``pad_id``, ``attention_mask`` (B, T) 1 = real token,
        ``token_type_ids`` (B, T), ``word_index`` (B, T) padded with -1, and when present ``labels`` (B, W) with
        W = the most words kept and ``subword_labels`` (B, T), both padded with -100.
    """
    batch = _collate_inputs(features, pad_id)
    T = batch["input_ids"].shape[1]
    batch["word_index"] = _pad([f["word_index"] for f in features], T, -1)
    if _optional(features, "labels"):
        W = max(f["n_words"] for f in features)
        batch["labels"] = _pad([f["labels"] for f in features], W, IGNORE_INDEX)
    if _optional(features, "subword_labels"):
        batch["subword_labels"] = _pad([f["subword_labels"] for f in features], T, IGNORE_INDEX)
    return {k: torch.from_numpy(v) for k, v in batch.items()}


# ---------------------------------------------------------------------------------------------- spans
Span = tuple[int, int, str]  # (start word, end word EXCLUSIVE, label)


def featurize_spans(examples: Sequence[tuple[Sequence[str], Sequence[Span] | None]], tokenizer: Any,
                    label_to_id: Mapping[str, int] | None, max_length: int,
                    max_span_width: int) -> tuple[list[dict[str, Any]], int, int]:
    """Sentences with labelled spans -> features for ``SpanClassificationHead``.

    Args:
        examples: (words, spans) pairs; spans are (start, end EXCLUSIVE, label) word indices, or None for
            prediction. Spans may nest or overlap; one span cannot carry two labels.
        tokenizer: a ``WordPieceTokenizer``.
        label_to_id: {label: index in the head's labels}; span class = index + 1 (0 = none).
        max_length: tokens per input, [CLS] and [SEP] included.
        max_span_width: the head's widest span in words.

    Returns:
        (features, number of truncated sentences, number of gold spans wider than ``max_span_width``, which
        cannot be represented and are dropped). A feature holds ``input_ids``, ``token_type_ids``,
        ``word_starts`` (position of each kept word's first sub-word), ``n_words``, ``n_words_total`` and, with
        spans, ``span_labels``: one class id per span of ``enumerate_spans(n_words, max_span_width)``. Gold spans
        that reach past the truncation are dropped with their sentence counted as truncated.

    Raises:
        LmforgeError: an unknown label, a span outside the sentence or empty, one span with two labels.
    """
    _check_common(max_length, label_to_id)
    if max_span_width < 1:
        raise LmforgeError(f"max_span_width must be >= 1, got {max_span_width}")
    features, n_truncated, n_too_wide = [], 0, 0
    for index, (words, gold) in enumerate(examples):
        pieces, kept = split_words(words, tokenizer, max_length)
        n_truncated += kept < len(words)
        ids, starts = _inputs(pieces, kept, tokenizer)
        feature: dict[str, Any] = {"input_ids": ids, "token_type_ids": [0] * len(ids), "word_starts": starts,
                                   "n_words": kept, "n_words_total": len(words)}
        if gold is not None and label_to_id is not None:
            position = {span: k for k, span in enumerate(enumerate_spans(kept, max_span_width))}
            labels = [0] * len(position)
            seen: dict[tuple[int, int], str] = {}
            for start, end, label in gold:
                integers = isinstance(start, int | np.integer) and isinstance(end, int | np.integer)
                if not (integers and 0 <= start < end <= len(words)):
                    raise LmforgeError(f"sentence {index}: span ({start!r}, {end!r}, {label!r}) is not a non-empty "
                                       f"word range within its {len(words)} words (end is exclusive)")
                class_id = _label_id(label, label_to_id, index) + 1
                if seen.setdefault((start, end), label) != label:
                    raise LmforgeError(f"sentence {index}: words {start}..{end - 1} are labelled both "
                                       f"{seen[(start, end)]!r} and {label!r}; a span takes one label")
                if end - start > max_span_width:
                    n_too_wide += 1
                elif end <= kept:
                    labels[position[(int(start), int(end) - 1)]] = class_id
            feature["span_labels"] = labels
        features.append(feature)
    return features, n_truncated, n_too_wide


def collate_spans(features: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad span features into a batch.

    Returns:
        ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids`` (B, T); ``word_starts`` (B, W)
        padded with 0 and ``word_mask`` (B, W) bool; and when present ``span_labels`` (B, S) padded with -100,
        S = the longest row = ``count_spans(W, max_span_width)`` (each row's spans are a prefix of that
        enumeration).
    """
    batch = _collate_inputs(features, pad_id)
    W = max(f["n_words"] for f in features)
    batch["word_starts"] = _pad([f["word_starts"] for f in features], W, 0)
    batch["word_mask"] = np.arange(W) < np.array([f["n_words"] for f in features])[:, None]
    if _optional(features, "span_labels"):
        rows = [f["span_labels"] for f in features]
        batch["span_labels"] = _pad(rows, max(map(len, rows)), IGNORE_INDEX)
    return {k: torch.from_numpy(v) for k, v in batch.items()}
