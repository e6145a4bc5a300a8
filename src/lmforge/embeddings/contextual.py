"""Contextual embeddings: hidden states of chosen layers, combined, pooled per text.

Layers are indexed like the model's ``hidden_states``: 0 is the embedding output, 1..L the layers, and
negative indices count from the last layer (-1 is the last). Several layers are combined by ``mean``,
``sum`` or ``concat`` (Devlin et al., 2019, Table 7, compare such choices for feature-based NER).
Pooling: ``none`` keeps one vector per token (all real tokens, [CLS] and [SEP] included), ``mean``
averages over real tokens only (padding never counts), ``cls`` takes the first token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

POOLINGS = ("none", "mean", "cls")
COMBINES = ("mean", "sum", "concat")


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
        inputs = {"attention_mask": mask}
        if "token_type_ids" in _forward_args(model):
            inputs["token_type_ids"] = batch["token_type_ids"].to(device)
        out = model(batch["input_ids"].to(device), output_hidden_states=True, **inputs)
        states = _select(out.hidden_states, layers, combine).float()  # (B, T, D')
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


def _forward_args(model: nn.Module) -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(model.forward).parameters)
