"""Find induction heads: score every attention head of a causal language model on repeated random tokens.

Olsson et al. (2022, "In-context Learning and Induction Heads") call a head an induction head when, reading a
token A that occurred before as ``... A B ...``, it attends to B, the token right after the earlier A (and its
output raises B's logit: the copy). On a sequence of ``seq_len`` random tokens repeated, every token of the second
and later repeats has exactly one such earlier position, ``seq_len - 1`` positions back, so a head's **induction
score** is its mean attention weight on that position (their "prefix matching" score; TransformerLens calls the
same quantity the induction score):

    score(l, h) = mean over samples b and query rows i in repeats 2.. of  A[l][b, h, i, i - seq_len + 1]

A perfect induction head scores 1; a head attending uniformly over its causal window scores about the mean of
1 / (i + 1) over those rows (roughly 1 / T); a head that ignores the repeat scores about that too. The circuit needs
two layers: a **previous-token head** in an earlier layer (it writes "my previous token was A" into B's position)
that a later head's keys read. ``previous_token_scores`` measures that half: the mean attention from each row to
the row before it.

The random tokens are drawn without replacement within one repeat (so "the earlier occurrence" is unique) from
the vocabulary less its special tokens. Only the copy half (the OV circuit raising B's logit) is not scored here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models import ARCHITECTURES, architecture, architectures_with

__all__ = ["HeadScores", "head_scores", "induction_pattern_scores", "induction_scores", "previous_token_scores",
           "repeated_random_ids", "write_prompt_attention"]


@dataclass
class HeadScores:
    """Induction and previous-token scores of every head, from one batch of repeated random sequences.

    Attributes:
        induction: (L, H) mean attention on the token after the previous occurrence of the current token.
        previous_token: (L, H) mean attention on the previous position.
        uniform: the induction score of a head that attends uniformly over its causal window (the floor).
        seq_len, n_repeats, n_samples: the probe: ``n_samples`` sequences of ``seq_len`` random tokens repeated
            ``n_repeats`` times.
    """

    induction: np.ndarray
    previous_token: np.ndarray
    uniform: float
    seq_len: int
    n_repeats: int
    n_samples: int

    def best(self, kind: str = "induction") -> list[tuple[int, float]]:
        """Per layer, ``(head index, score)`` of the head with the highest ``kind`` score ("induction" or
        "previous_token")."""
        scores = {"induction": self.induction, "previous_token": self.previous_token}.get(kind)
        if scores is None:
            raise LmforgeError(f"kind={kind!r} is not one of induction, previous_token")
        return [(int(row.argmax()), float(row.max())) for row in scores]

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and numbers, ready for JSON."""
        return {"induction": self.induction.round(4).tolist(), "previous_token": self.previous_token.round(4).tolist(),
                "uniform": round(self.uniform, 4), "best_induction": self.best("induction"),
                "best_previous_token": self.best("previous_token"), "seq_len": self.seq_len,
                "n_repeats": self.n_repeats, "n_samples": self.n_samples}


def _causal_backbone(model: nn.Module) -> nn.Module:
    """The model itself (or a TaskModel's backbone) when its family is a causal LM that returns attention weights."""
    model = getattr(model, "backbone", model)
    arch = getattr(getattr(model, "config", None), "arch", None)
    family = architecture(arch) if arch in ARCHITECTURES else None
    if family is None or not (family.is_causal_lm and family.returns_attention):
        wanted = sorted(set(architectures_with("is_causal_lm")) & set(architectures_with("returns_attention")))
        raise LmforgeError(f"induction scores need a causal language model that returns attention weights; got a "
                           f"{type(model).__name__} (arch {arch!r}); use one of: {', '.join(wanted)} (e.g. a model "
                           "pretrained with `lmforge pretrain --objective clm`)")
    return model


def _candidates(tokenizer_or_ids: Any) -> np.ndarray:
    """Token ids to draw from: a tokenizer's vocabulary without its special tokens, or the ids given."""
    if hasattr(tokenizer_or_ids, "ids_to_tokens") and hasattr(tokenizer_or_ids, "special_ids"):
        special = set(tokenizer_or_ids.special_ids)
        ids = [i for i, tok in enumerate(tokenizer_or_ids.ids_to_tokens) if tok is not None and i not in special]
    else:
        try:
            ids = [int(i) for i in tokenizer_or_ids]
        except (TypeError, ValueError):
            raise LmforgeError("tokenizer_or_ids must be a WordPieceTokenizer or a sequence of token ids; got "
                               f"{type(tokenizer_or_ids).__name__}") from None
    ids = sorted(set(ids))
    if len(ids) < 2:
        raise LmforgeError(f"need at least 2 distinct candidate token ids to draw random sequences; got {len(ids)}")
    return np.asarray(ids, dtype=np.int64)


def repeated_random_ids(candidates: Sequence[int] | np.ndarray, *, seq_len: int, n_repeats: int, n_samples: int,
                        rng: np.random.Generator, prefix: Sequence[int] = ()) -> np.ndarray:
    """(n_samples, len(prefix) + seq_len * n_repeats) int64: ``prefix`` then ``seq_len`` distinct random ids from
    ``candidates`` repeated ``n_repeats`` times, a new draw per sample."""
    candidates = np.asarray(candidates, dtype=np.int64)
    if seq_len < 2 or seq_len > len(candidates):
        raise LmforgeError(f"seq_len={seq_len} must be in [2, {len(candidates)}] (the tokens of one repeat are "
                           "distinct draws from the candidate ids); lower seq_len")
    if n_repeats < 2:
        raise LmforgeError(f"n_repeats={n_repeats} must be >= 2: the induction pattern needs an earlier occurrence")
    if n_samples < 1:
        raise LmforgeError(f"n_samples={n_samples} must be >= 1")
    rows = [np.concatenate([np.asarray(prefix, dtype=np.int64),
                            np.tile(rng.choice(candidates, size=seq_len, replace=False), n_repeats)])
            for _ in range(n_samples)]
    return np.stack(rows)


def induction_pattern_scores(weights: np.ndarray | torch.Tensor, seq_len: int, start: int = 0) -> np.ndarray:
    """Induction scores of attention weights on repeated sequences.

    Args:
        weights: (L, B, H, T, T) (or (B, H, T, T) for one layer) attention weights, rows = queries.
        seq_len: the length of one repeat.
        start: the position where the first repeat begins (the length of a prefix before it).

    Returns:
        (L, H) (or (H,)) mean over samples and over the rows of the second and later repeats of the weight on
        ``row - seq_len + 1``.
    """
    w = torch.as_tensor(weights, dtype=torch.float32)
    T = w.shape[-1]
    rows = torch.arange(start + seq_len, T)
    if len(rows) == 0:
        raise LmforgeError(f"no second repeat: length {T} < start {start} + 2 x seq_len {seq_len}")
    picked = w[..., rows, rows - seq_len + 1]  # (..., B, H, R)
    return picked.mean(dim=-1).mean(dim=-2).numpy()  # (..., H)


def _previous_scores(w: torch.Tensor, start: int) -> np.ndarray:
    rows = torch.arange(start + 1, w.shape[-1])
    return w[..., rows, rows - 1].mean(dim=-1).mean(dim=-2).numpy()


@torch.no_grad()
def _attention_weights(model: nn.Module, ids: np.ndarray, batch_size: int = 8) -> torch.Tensor:
    """(L, B, H, T, T) float32 attention weights of every layer, in eval mode (no dropout), in small batches."""
    limit = getattr(model.config, "max_seq_len", None)
    if limit is not None and architecture(model.config.arch).position_limited and ids.shape[1] > limit:
        raise LmforgeError(f"the probe is {ids.shape[1]} tokens but the model reads at most max_seq_len={limit}; "
                           "lower seq_len or n_repeats")
    was_training = model.training
    model.eval()
    try:
        parts = []
        for i in range(0, len(ids), batch_size):
            out = model(torch.from_numpy(ids[i:i + batch_size]), output_attentions=True)
            if not out.attentions or any(a is None for a in out.attentions):
                raise LmforgeError(f"{type(model).__name__} returned no attention weights for some layer")
            parts.append(torch.stack([a.float() for a in out.attentions]))  # (L, b, H, T, T)
    finally:
        model.train(was_training)
    return torch.cat(parts, dim=1)


def head_scores(model: nn.Module, tokenizer_or_ids: Any, *, seq_len: int, n_repeats: int = 2, n_samples: int = 16,
                seed: int = 0, prefix: Sequence[int] = ()) -> HeadScores:
    """Induction and previous-token scores of every head of a causal LM (see the module docstring).

    Args:
        model: a ``Decoder`` (GPT) or another causal-LM family that returns attention weights; a TaskModel's
            backbone is used.
        tokenizer_or_ids: the model's tokenizer (its vocabulary less the special tokens is drawn from) or the
            candidate token ids themselves.
        seq_len: tokens per repeat (distinct within a repeat, so at most the number of candidates).
        n_repeats: repeats per sequence (>= 2); the probe has ``len(prefix) + seq_len * n_repeats`` tokens.
        n_samples: random sequences averaged over.
        seed: the random seed of the draws.
        prefix: ids put before the first repeat, e.g. ``[tokenizer.sep_id]``, how a prompt to an lmforge causal LM
            starts (not scored as queries of either score).

    Returns:
        HeadScores with (L, H) arrays.

    Raises:
        LmforgeError: not a causal LM returning attention, a probe longer than the model's positions, bad sizes.
    """
    model = _causal_backbone(model)
    candidates = _candidates(tokenizer_or_ids)
    ids = repeated_random_ids(candidates, seq_len=seq_len, n_repeats=n_repeats, n_samples=n_samples,
                              rng=np.random.default_rng(seed), prefix=prefix)
    w = _attention_weights(model, ids)  # (L, B, H, T, T)
    start, T = len(prefix), ids.shape[1]
    uniform = float(np.mean([1.0 / (i + 1) for i in range(start + seq_len, T)]))
    return HeadScores(induction_pattern_scores(w, seq_len, start), _previous_scores(w, start), uniform, seq_len,
                      n_repeats, n_samples)


def induction_scores(model: nn.Module, tokenizer_or_ids: Any, *, seq_len: int, n_repeats: int = 2,
                     n_samples: int = 16, seed: int = 0, prefix: Sequence[int] = ()) -> np.ndarray:
    """(L, H) induction score of every head: ``head_scores(...).induction`` (see ``head_scores`` for the
    arguments)."""
    return head_scores(model, tokenizer_or_ids, seq_len=seq_len, n_repeats=n_repeats, n_samples=n_samples,
                       seed=seed, prefix=prefix).induction


def previous_token_scores(model: nn.Module, tokenizer_or_ids: Any, *, seq_len: int, n_repeats: int = 2,
                          n_samples: int = 16, seed: int = 0, prefix: Sequence[int] = ()) -> np.ndarray:
    """(L, H) previous-token score of every head (the first half of the induction circuit):
    ``head_scores(...).previous_token``."""
    return head_scores(model, tokenizer_or_ids, seq_len=seq_len, n_repeats=n_repeats, n_samples=n_samples,
                       seed=seed, prefix=prefix).previous_token


def write_prompt_attention(model: nn.Module, tokenizer: Any, text: str, path: str | Path, *,
                           scores: HeadScores | None = None, precision: str = "auto") -> Path:
    """Write the attention viewer (``lmforge.viz.html``) for one prompt, e.g. a few-shot prompt, to ``path``.

    The weights come from ``lmforge.viz.attention.collect_attention`` (all layers and heads), exactly what
    ``lmforge viz attention`` shows; the text is tokenized as is (write ``[SEP]`` at its start to show the
    document-start token that a causal-LM prompt begins with). With ``scores``, the viewer's title names the
    best induction head of each layer, so the reader knows which head to pick.

    Returns:
        The path written.
    """
    from lmforge.viz.attention import collect_attention
    from lmforge.viz.html import write_attention_html

    attn = collect_attention(_causal_backbone(model), tokenizer, text)
    if scores is not None:
        best = "; ".join(f"layer {layer} head {head}: {score:.2f}"
                         for layer, (head, score) in enumerate(scores.best("induction")))
        attn.title += f" - best induction head per layer ({best})"
    return write_attention_html(attn, path, precision=precision)
