"""Pooling sub-word vectors into word vectors: by the word's first sub-word, or the mean of its sub-words.

Used by the token-classification head (Devlin et al. 2019 score a word by its first sub-word) and by contextual
word embeddings (``lmforge.embeddings.contextual``). ``concat_pool``: ULMFiT's document vector [h_T; max; mean]
(the AWD-LSTM classifier, ``lmforge.models.awd_lstm``).

Shapes: B batch, T sub-word positions, W word slots, L values per position.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmforge.choices import WORD_POOLINGS
from lmforge.errors import LmforgeError


def pool_words(scores: Tensor, word_index: Tensor, n_words: int, how: str = "first") -> tuple[Tensor, Tensor]:
    """Sub-word scores -> word scores.

    Args:
        scores: (B, T, L) per sub-word.
        word_index: (B, T) long, the word of each sub-word (0-based), -1 for specials and padding.
        n_words: W, the width of the word axis (> every index in ``word_index``).
        how: "first" (the word's first sub-word) or "mean" (the average over the word's sub-words).

    Returns:
        (B, W, L) word scores (0 for absent words) and the (B, W) bool mask of present words.
    """
    if how not in WORD_POOLINGS:
        raise LmforgeError(f"unknown word_pooling {how!r}; choose one of {', '.join(WORD_POOLINGS)}")
    B, T, L = scores.shape
    if tuple(word_index.shape) != (B, T):
        raise LmforgeError(f"word_index must be (batch={B}, length={T}) like the input ids; got "
                           f"{tuple(word_index.shape)}")
    if word_index.is_floating_point() or word_index.dtype == torch.bool:
        raise LmforgeError(f"word_index must hold integers (torch.long); got dtype {word_index.dtype}")
    if word_index.numel() and int(word_index.max()) >= n_words:
        raise LmforgeError(f"word_index refers to word {int(word_index.max())} but there are only {n_words} word "
                           "slots (the labels' width); build both with the same featurizer")
    if n_words == 0:  # no sentence has a word (scatter cannot index an empty axis)
        return scores.new_zeros(B, 0, L), torch.zeros(B, 0, dtype=torch.bool, device=scores.device)
    real = word_index >= 0  # (B, T)
    slot = word_index.clamp(min=0)  # (B, T) specials point at word 0 but are masked out
    counts = torch.zeros(B, n_words, device=scores.device).scatter_add_(1, slot, real.float())  # (B, W)
    word_mask = counts > 0
    if how == "first":
        position = torch.arange(T, device=scores.device).expand(B, T).masked_fill(~real, T)  # (B, T)
        first = torch.full((B, n_words), T, device=scores.device, dtype=torch.long)
        first = first.scatter_reduce_(1, slot, position, reduce="amin").masked_fill(~word_mask, 0)  # (B, W)
        pooled = scores.gather(1, first.unsqueeze(2).expand(B, n_words, L))  # (B, W, L)
        return pooled.masked_fill(~word_mask.unsqueeze(2), 0.0), word_mask
    summed = scores.new_zeros(B, n_words, L).scatter_add_(
        1, slot.unsqueeze(2).expand(B, T, L), scores.masked_fill(~real.unsqueeze(2), 0.0))  # (B, W, L)
    return summed / counts.clamp(min=1).unsqueeze(2).to(scores.dtype), word_mask


def concat_pool(states: Tensor, mask: Tensor | None = None) -> Tensor:
    """ULMFiT's concat pooling (Howard & Ruder 2018, section 3.3): h_c = [h_T; maxpool(H); meanpool(H)] over each
    row's real positions, h_T its last real position's state.

    Args:
        states: (B, T, D) per-position states.
        mask: (B, T) bool, True = real token (padding may sit anywhere); None = all real. Every row needs at least
            one real position.

    Returns:
        (B, 3 D).
    """
    B, T, D = states.shape
    if mask is None:
        return torch.cat((states[:, -1], states.amax(1), states.mean(1)), dim=-1)
    if mask.shape != (B, T):
        raise LmforgeError(f"the mask must be (batch={B}, length={T}) like the states; got {tuple(mask.shape)}")
    real = mask.unsqueeze(-1)  # (B, T, 1)
    n = mask.sum(1)  # (B,)
    if bool((n == 0).any()):
        raise LmforgeError("concat pooling needs at least one real token in every row; a row of the batch is "
                           "all padding")
    positions = torch.arange(T, device=states.device).expand(B, T)
    last = positions.masked_fill(~mask, -1).amax(1)  # (B,) the last real position
    h_last = states[torch.arange(B, device=states.device), last]  # (B, D)
    h_max = states.masked_fill(~real, float("-inf")).amax(1)  # (B, D)
    h_mean = states.masked_fill(~real, 0.0).sum(1) / n.unsqueeze(-1).to(states.dtype)  # (B, D)
    return torch.cat((h_last, h_max, h_mean), dim=-1)
