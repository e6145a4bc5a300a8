"""Iterating over a list of prepared features in micro-batches, in a seeded order, resumably: the training data
of every fine-tuning task and of the encoder-decoders (pretraining has its own, ``lmforge.data.pretraining``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from lmforge.errors import LmforgeError

Feature = dict[str, Any]


GROUP_BATCHES = 50  # group_by_length: micro-batches per sorted group (transformers' megabatch multiplier)


def feature_length(feature: Feature) -> int:
    """Tokens of a feature, the sort key of length grouping (training) and of inference batches
    (``lmforge.tasks.base.run_model``): its ``length`` entry (the cost a task computed: windows x the longest one),
    else its longest window, its ``input_ids`` (tagging, QA) or, for an encoder-decoder pair, ``src_ids`` plus
    ``tgt_ids``."""
    if "length" in feature:
        return int(feature["length"])
    if feature.get("windows"):
        return max(len(w) for w in feature["windows"])
    if "input_ids" in feature:
        ids = feature["input_ids"]
        return max((len(x) for x in ids), default=0) if ids and isinstance(ids[0], list | tuple) else len(ids)
    return len(feature.get("src_ids", ())) + len(feature.get("tgt_ids", ()))


class FeatureData:
    """Training features in a seeded random order per epoch, in micro-batches; exactly resumable.

    The order of epoch e is a permutation drawn from ``seed + e``; the position is (epoch, index), so a resumed
    run continues with the same batches. Under DDP each process takes every ``world_size``-th feature of the
    permutation (the last batch of an epoch may be smaller).

    ``group_by_length``: the permutation is cut into groups of ``GROUP_BATCHES`` global micro-batches, each group
    sorted by ``feature_length``, longest first (so the largest batch comes early), before the processes take their
    share: each batch then holds features of similar length and needs little padding, while the groups keep the
    epoch's order random. Deterministic, so resuming stays exact.
    """

    def __init__(self, features: list[Feature], collate: Callable[[list[Feature]], dict[str, Tensor]], *,
                 seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1,
                 group_by_length: bool = False) -> None:
        if not features:
            raise LmforgeError("no training example: the training file gave no feature")
        self.features, self.collate, self.seed, self.shuffle = features, collate, seed, shuffle
        self.rank, self.world_size, self.group_by_length = rank, world_size, group_by_length
        self.epoch, self.position = 0, 0

    def _order(self, micro_batch_size: int = 1) -> list[int]:
        if not self.shuffle:
            order = list(range(len(self.features)))
        else:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.features), generator=generator).tolist()
        if self.group_by_length:
            size = GROUP_BATCHES * micro_batch_size * self.world_size
            lengths = [feature_length(f) for f in self.features]
            order = [i for g in range(0, len(order), size)
                     for i in sorted(order[g:g + size], key=lambda i: -lengths[i])]  # stable: ties keep the order
        return order[self.rank::self.world_size]

    def batches(self, micro_batch_size: int) -> Iterator[dict[str, Tensor]]:
        order = self._order(micro_batch_size)
        while self.position < len(order):
            chunk = order[self.position:self.position + micro_batch_size]
            self.position += len(chunk)
            yield self.collate([self.features[i] for i in chunk])
        self.epoch, self.position = self.epoch + 1, 0

    def steps_per_epoch(self, batch_size: int) -> int:
        return max(1, math.ceil(len(self.features) / batch_size))

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
