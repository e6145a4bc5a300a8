"""Tiny models, a contract-following objective and deterministic data for the Trainer tests (and their worker)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.config import ModelConfig, TrainConfig
from lmforge.training import ObjectiveOutput

V, D, T = 99, 12, 7


class TinyLM(nn.Module):
    """Embedding -> LayerNorm -> tanh(Linear) -> dropout -> Linear: predicts the next token from the current one."""

    def __init__(self, vocab: int = V, d: int = D, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.proj = nn.Linear(d, 37)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(37, vocab)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.out(self.drop(torch.tanh(self.proj(self.norm(self.embed(input_ids))))))  # (B, T, V)


def decoder_config(**overrides: Any) -> ModelConfig:
    values = dict(arch="decoder", vocab_size=V, d_model=D, n_heads=2, n_layers=2, d_ff=37, max_seq_len=16,
                  dropout=0.1, attention_dropout=0.1, norm_first=True, layer_norm_eps=1e-5,
                  kernel="math")
    values.update(overrides)
    return ModelConfig(**values)


def tiny_decoder(seed: int = 0, **overrides: Any) -> nn.Module:
    from lmforge.models.decoder import Decoder

    torch.manual_seed(seed)
    return Decoder(decoder_config(**overrides))


def tiny_lm(seed: int = 0, dropout: float = 0.0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(dropout=dropout)


class LMObjective:
    """Next-token cross-entropy summed over labelled positions (labels -100 are skipped) and, with ``two_terms``,
    a per-sequence term: predicting token 1 from position 0 (one item per sequence)."""

    def __init__(self, two_terms: bool = False, nan_at_call: int | None = None) -> None:
        self.two_terms = two_terms
        self.nan_at_call = nan_at_call
        self.calls = 0

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        self.calls += 1
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        logits = out.logits if hasattr(out, "logits") else out  # (B, T, V)
        labels = batch["labels"]
        flat = logits.reshape(-1, logits.shape[-1]).float()
        lm = F.cross_entropy(flat, labels.reshape(-1), ignore_index=-100, reduction="sum")
        if self.nan_at_call is not None and self.calls >= self.nan_at_call:
            lm = lm * float("nan")
        valid = labels != -100
        correct = ((logits.argmax(-1) == labels) & valid).sum()
        losses = {"lm": (lm, valid.sum())}
        if self.two_terms:
            losses["seq"] = (F.cross_entropy(logits[:, 0].float(), batch["input_ids"][:, 1], reduction="sum"),
                             labels.shape[0])
        return ObjectiveOutput(losses, {"lm_accuracy": (correct, valid.sum())})

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        counts = {"lm": int((batch["labels"] != -100).sum())}
        if self.two_terms:
            counts["seq"] = batch["labels"].shape[0]
        return counts


class ToyData:
    """``n`` random sequences of length <= T (padding 0, next-token labels, about 30% of labels dropped so that
    micro-batches predict different numbers of tokens), reshuffled every epoch from ``seed`` and the epoch.

    For ``world`` > 1 processes each global batch of ``per_rank * world`` sequences is split into consecutive
    per-process slices, so the union of what the processes see in a step is the single-process global batch.
    ``fixed`` keeps the order (evaluation data). ``die_at`` kills this process with SIGKILL when the die_at-th batch
    (counted in this process) is requested.
    """

    def __init__(self, n: int = 48, seed: int = 0, rank: int = 0, world: int = 1, per_rank: int = 1,
                 fixed: bool = False, die_at: int | None = None, same_batch: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(1, V, (n, T), generator=g)
        lengths = torch.randint(2, T + 1, (n,), generator=g)
        mask = torch.arange(T)[None, :] < lengths[:, None]
        ids[~mask] = 0
        labels = torch.full_like(ids, -100)
        labels[:, :-1] = torch.where(mask[:, 1:], ids[:, 1:], -100)
        labels[torch.rand(n, T, generator=g) < 0.3] = -100
        self.ids, self.mask, self.labels = ids, mask.long(), labels
        self.n, self.seed, self.rank, self.world, self.per_rank = n, seed, rank, world, per_rank
        self.fixed, self.die_at, self.same_batch = fixed, die_at, same_batch
        self.epoch, self.pos, self.requested = 0, 0, 0

    def _order(self) -> Tensor:
        if self.fixed or self.same_batch:
            order = torch.arange(self.n)
        else:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(1000 * self.seed + self.epoch))
        if self.world > 1:
            order = order.view(-1, self.world, self.per_rank)[:, self.rank].reshape(-1)
        return order

    def batch(self, idx: Tensor) -> dict[str, Tensor]:
        return {"input_ids": self.ids[idx], "attention_mask": self.mask[idx], "labels": self.labels[idx]}

    def batches(self, micro_batch_size: int) -> Iterator[dict[str, Tensor]]:
        order = self._order()
        if self.fixed:  # evaluation: the same finite pass every call, no state
            for start in range(0, len(order) - micro_batch_size + 1, micro_batch_size):
                yield self.batch(order[start:start + micro_batch_size])
            return
        while self.same_batch or self.pos + micro_batch_size <= len(order):
            self.requested += 1
            if self.die_at is not None and self.requested == self.die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            start = 0 if self.same_batch else self.pos
            idx = order[start:start + micro_batch_size]
            self.pos += micro_batch_size
            yield self.batch(idx)
        self.epoch += 1
        self.pos = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]


def train_config(**overrides: Any) -> TrainConfig:
    values: dict[str, Any] = dict(max_steps=4, batch_size=8, micro_batch_size=2, lr=1e-2, schedule="linear",
                                  warmup_steps=1, log_every=1, save_every=0, keep_last=0, eval_batches=3, seed=0,
                                  device="cpu")
    values.update(overrides)
    return TrainConfig(**values)


def read_jsonl(path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in open(path, encoding="utf-8")]


def losses_by_step(run) -> list[tuple[int, float]]:
    """(step, loss) of every training record of a run folder's metrics.jsonl."""
    return [(r["step"], r["loss"]) for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]


TIMING_KEYS = ("tokens_per_s", "elapsed_s")


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]
