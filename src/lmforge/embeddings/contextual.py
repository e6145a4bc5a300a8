"""Contextual embeddings: hidden states of chosen layers, combined, pooled per text or per word.

Layers are indexed like the model's ``hidden_states``: 0 is the embedding output, 1..L the layers, and
negative indices count from the last layer (-1 is the last). Several layers are combined by ``mean``,
``sum`` or ``concat`` (Devlin et al., 2019, Table 7, compare such choices for feature-based NER).

Per text (:func:`embed_texts`), pooling: ``none`` keeps one vector per token (all real tokens, [CLS] and [SEP]
included), ``mean`` averages over real tokens only (padding never counts), ``cls`` takes the first token.

Per word (:func:`embed_words`), one vector per word from its sub-words: ``first`` takes the first sub-word
(what Devlin et al. 2019, section 5.3, feed to their tagger), ``mean`` averages all of them. A raw text is split
into words as the tokenizer splits it (whitespace, then punctuation: BERT's basic words), and each word keeps
its character span; pre-split input (a list of words, e.g. CoNLL tokens) keeps its words as given.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from lmforge.choices import TEXT_POOLINGS, WORD_POOLINGS
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

POOLINGS = TEXT_POOLINGS
COMBINES = ("mean", "sum", "concat")


class WordVectors(NamedTuple):
    """One text's words and their contextual vectors (what :func:`embed_words` returns per text).

    Attributes:
        words: the W words kept, as strings: for a raw text its basic words as written in the text (original
            case), for pre-split input the given words.
        vectors: (W, D') float32, one row per word.
        spans: (start, end) character offsets of each word in the raw text (``text[start:end] == word``); None for
            pre-split input.
        n_words_total: the words of the input; more than W when the input was longer than ``max_length`` and
            its last words were cut.
    """

    words: list[str]
    vectors: np.ndarray
    spans: list[tuple[int, int]] | None
    n_words_total: int


def parse_layers(text: str | Sequence[int]) -> list[int]:
    """``"-4,-3,-2,-1"`` -> [-4, -3, -2, -1]."""
    if not isinstance(text, str):
        return [int(x) for x in text]
    try:
        layers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LmforgeError(f"--layers {text!r} must be comma-separated integers such as -1 or -4,-3,-2,-1") from None
    if not layers:
        raise LmforgeError("--layers is empty; give at least one layer index such as -1")
    return layers


def _select(hidden_states: Sequence[torch.Tensor], layers: Sequence[int], combine: str) -> torch.Tensor:
    n = len(hidden_states)
    for i in layers:
        if not -n <= i < n:
            raise LmforgeError(f"layer {i} does not exist: this model has {n - 1} layers plus the embedding "
                               f"output, so valid indices are {-n}..{n - 1}")
    chosen = [hidden_states[i] for i in layers]  # each (B, T, D)
    if len(chosen) == 1:
        return chosen[0]
    widths = {h.shape[-1] for h in chosen}
    if combine != "concat" and len(widths) > 1:  # e.g. an AWD-LSTM's inner layers are wider than its last
        shown = ", ".join(f"{i}: {hidden_states[i].shape[-1]}" for i in layers)
        raise LmforgeError(f"--combine {combine} needs layers of one width, and these differ (layer: width = "
                           f"{shown}); use --combine concat, or choose layers of the same width")
    if combine == "mean":
        return torch.stack(chosen).mean(0)
    if combine == "sum":
        return torch.stack(chosen).sum(0)
    return torch.cat(chosen, dim=-1)  # (B, T, len(layers) * D)


@torch.no_grad()
def embed_texts(model: nn.Module, tokenizer, texts: Sequence[str], *, layers: Sequence[int] = (-1,),
                combine: str = "mean", pooling: str = "mean", batch_size: int = 32, max_length: int | None = None,
                show_progress: bool = False) -> np.ndarray | list[np.ndarray]:
    """Embed texts with a model that returns ``hidden_states`` (``Encoder``, ``Decoder``).

    Returns:
        ``pooling="none"``: a list with one (T_i, D') float32 array per text; otherwise an (N, D') array.
        D' is D, or len(layers) * D for ``combine="concat"``.
    """
    if pooling not in POOLINGS:
        raise LmforgeError(f"pooling={pooling!r} is not one of {', '.join(POOLINGS)}")
    if combine not in COMBINES:
        raise LmforgeError(f"combine={combine!r} is not one of {', '.join(COMBINES)}")
    if batch_size < 1:
        raise LmforgeError(f"batch_size must be >= 1, got {batch_size}")
    limit = getattr(getattr(model, "config", None), "max_seq_len", None)
    max_length = min(max_length or limit or 512, limit or 512)
    model.eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths share a batch
    results: list[np.ndarray | None] = [None] * len(texts)
    truncated = 0
    device = next(model.parameters()).device
    for start in tqdm(range(0, len(order), batch_size), desc="embedding", unit="batch", disable=not show_progress):
        idx = order[start:start + batch_size]
        batch = tokenizer([texts[i] for i in idx], max_length=max_length, truncation=True, padding=True,
                          return_tensors="pt")
        truncated += batch.num_truncated
        mask = batch["attention_mask"].to(device)
        states = _hidden(model, batch["input_ids"].to(device), mask, batch["token_type_ids"].to(device), layers,
                         combine)  # (B, T, D')
        if pooling == "mean":
            m = mask.unsqueeze(-1).to(states.dtype)  # (B, T, 1)
            pooled = (states * m).sum(1) / m.sum(1).clamp(min=1.0)  # (B, D')
        elif pooling == "cls":
            pooled = states[:, 0]  # (B, D')
        for row, i in enumerate(idx):
            if pooling == "none":
                results[i] = states[row, : int(mask[row].sum())].cpu().numpy()
            else:
                results[i] = pooled[row].cpu().numpy()
    if truncated:
        log.warning("%d of %d texts were longer than %d tokens and were truncated", truncated, len(texts),
                    max_length)
    if pooling == "none":
        return results  # type: ignore[return-value]
    if not results:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack(results).astype(np.float32)  # type: ignore[arg-type]


def _hidden(model: nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, token_type_ids: torch.Tensor,
            layers: Sequence[int], combine: str) -> torch.Tensor:
    """(B, T, D') fp32: the chosen hidden states of one padded batch, combined."""
    inputs = {"attention_mask": mask}
    if "token_type_ids" in _forward_args(model):
        inputs["token_type_ids"] = token_type_ids
    out = model(input_ids, output_hidden_states=True, **inputs)
    return _select(out.hidden_states, layers, combine).float()


def _forward_args(model: nn.Module) -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(model.forward).parameters)


def _check_options(layers: Sequence[int], combine: str, batch_size: int) -> None:
    if combine not in COMBINES:
        raise LmforgeError(f"combine={combine!r} is not one of {', '.join(COMBINES)}")
    if batch_size < 1:
        raise LmforgeError(f"batch_size must be >= 1, got {batch_size}")
    if not layers:
        raise LmforgeError("layers is empty; give at least one layer index such as -1")


def _word_pieces(tokenizer, item: str | Sequence[str], index: int) \
        -> tuple[list[str], list[list[int]], list[tuple[int, int]] | None]:
    """Words, sub-word ids per word (never empty) and character spans (None for pre-split input) of one input."""
    if isinstance(item, str):
        ids, offsets, word_of = tokenizer.encode_text(item)
        by_word: dict[int, tuple[list[int], list[int]]] = {}  # word index -> (piece ids, [start, end])
        for piece, (start, end), w in zip(ids, offsets, word_of, strict=True):
            word_pieces, span = by_word.setdefault(w, ([], [start, end]))
            word_pieces.append(piece)
            span[0], span[1] = min(span[0], start), max(span[1], end)
        ordered = [by_word[w] for w in sorted(by_word)]
        spans = [(s, e) for _, (s, e) in ordered]
        return [item[s:e] for s, e in spans], [p for p, _ in ordered], spans
    if not isinstance(item, (list, tuple)) or not all(isinstance(w, str) for w in item):
        raise LmforgeError(f"input {index} must be a text (str) or a list of words (list of str), got "
                           f"{type(item).__name__}")
    # A word that yields no sub-word (a lone control character) becomes [UNK], so every word gets a vector
    # (as lmforge.data.token_features does for tagging).
    return list(item), [tokenizer.encode_ids(w) or [tokenizer.unk_id] for w in item], None


def _words_that_fit(pieces: Sequence[Sequence[int]], max_length: int) -> int:
    """How many leading words fit in ``max_length`` tokens with [CLS] and [SEP] (whole words only)."""
    budget, kept = max_length - 2, 0
    for p in pieces:
        if len(p) > budget:
            break
        budget -= len(p)
        kept += 1
    return kept


@torch.no_grad()
def embed_words(model: nn.Module, tokenizer, texts: Sequence[str] | Sequence[Sequence[str]], *,
                layers: Sequence[int] = (-1,), combine: str = "mean", word_pooling: str = "first",
                batch_size: int = 32, max_length: int | None = None,
                show_progress: bool = False) -> list[WordVectors]:
    """One contextual vector per word: the chosen layers combined, then pooled over each word's sub-words.

    Each input is encoded as ``[CLS] sub-words [SEP]`` (token types 0). Inputs longer than ``max_length`` keep
    their leading whole words (the rest get no vector; ``n_words_total`` says how many there were) and a warning
    counts them.

    Args:
        model: a model whose forward takes ``output_hidden_states=True`` and returns ``hidden_states``
            (``Encoder``).
        tokenizer: a ``WordPieceTokenizer`` (``encode_text``, ``encode_ids``, ``cls_id``, ``sep_id``, ``pad_id``,
            ``unk_id``).
        texts: raw texts (str), or pre-split inputs (lists of words); one kind or the other per input.
        layers: hidden-state indices (see the module docstring).
        combine: ``mean``, ``sum`` or ``concat`` of the layers.
        word_pooling: ``first`` (the word's first sub-word) or ``mean`` (the average of its sub-words).
        batch_size: inputs per forward pass.
        max_length: tokens per input with [CLS] and [SEP] (default and ceiling: the model's ``max_seq_len``).
        show_progress: a progress bar.

    Returns:
        One :class:`WordVectors` per input, in input order; ``vectors`` is (W_i, D') float32 with D' = D, or
        len(layers) * D for ``combine="concat"`` (an input without words gives a (0, D') array).
    """
    from lmforge.nn.pooling import pool_words

    if word_pooling not in WORD_POOLINGS:
        raise LmforgeError(f"word_pooling={word_pooling!r} is not one of {', '.join(WORD_POOLINGS)}")
    layers = list(layers)
    _check_options(layers, combine, batch_size)
    limit = getattr(getattr(model, "config", None), "max_seq_len", None) or 512
    max_length = min(max_length or limit, limit)
    if max_length < 3:
        raise LmforgeError(f"max_length must be >= 3 ([CLS], one sub-word, [SEP]); got {max_length}")
    split = [_word_pieces(tokenizer, item, i) for i, item in enumerate(texts)]
    kept = [_words_that_fit(pieces, max_length) for _, pieces, _ in split]
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(split)), key=lambda i: sum(map(len, split[i][1][:kept[i]])))  # similar lengths
    results: list[WordVectors | None] = [None] * len(split)
    for start in tqdm(range(0, len(order), batch_size), desc="embedding", unit="batch", disable=not show_progress):
        idx = order[start:start + batch_size]
        rows, word_rows = [], []
        for i in idx:
            pieces = split[i][1][:kept[i]]
            rows.append([tokenizer.cls_id, *(p for word in pieces for p in word), tokenizer.sep_id])
            word_rows.append([-1, *(w for w, word in enumerate(pieces) for _ in word), -1])
        width = max(map(len, rows))
        ids = torch.full((len(idx), width), tokenizer.pad_id, dtype=torch.long)  # (B, T)
        word_index = torch.full((len(idx), width), -1, dtype=torch.long)  # (B, T), -1 = no word
        for b, (row, words) in enumerate(zip(rows, word_rows, strict=True)):
            ids[b, :len(row)] = torch.tensor(row)
            word_index[b, :len(words)] = torch.tensor(words)
        mask = (torch.arange(width) < torch.tensor([len(r) for r in rows]).unsqueeze(1)).long()  # (B, T) 1 = real
        states = _hidden(model, ids.to(device), mask.to(device), torch.zeros_like(ids).to(device), layers,
                         combine)  # (B, T, D')
        pooled, _ = pool_words(states, word_index.to(device), max(kept[i] for i in idx), word_pooling)  # (B, W, D')
        pooled = pooled.cpu().numpy()
        for b, i in enumerate(idx):
            words, _, spans = split[i]
            n = kept[i]
            results[i] = WordVectors(words[:n], np.ascontiguousarray(pooled[b, :n], dtype=np.float32),
                                     None if spans is None else spans[:n], len(words))
    cut = sum(1 for i, (words, _, _) in enumerate(split) if kept[i] < len(words))
    if cut:
        log.warning("%d of %d inputs were longer than %d tokens; their last words were cut and have no vector",
                    cut, len(split), max_length)
    return results  # type: ignore[return-value]
