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


class FeatureData:
    """Training features in a seeded random order per epoch, in micro-batches; exactly resumable.

    The order of epoch e is a permutation drawn from ``seed + e``; the position is (epoch, index), so a resumed
    run continues with the same batches. Under DDP each process takes every ``world_size``-th feature of the
    permutation (the last batch of an epoch may be smaller).
    """

    def __init__(self, features: list[Feature], collate: Callable[[list[Feature]], dict[str, Tensor]], *,
                 seed: int = 0, shuffle: bool = True, rank: int = 0, world_size: int = 1) -> None:
        if not features:
            raise LmforgeError("no training example: the training file gave no feature")
        self.features, self.collate, self.seed, self.shuffle = features, collate, seed, shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0

    def _order(self) -> list[int]:
        if not self.shuffle:
            order = list(range(len(self.features)))
        else:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.features), generator=generator).tolist()
        return order[self.rank::self.world_size]

    def batches(self, micro_batch_size: int) -> Iterator[dict[str, Tensor]]:
        order = self._order()
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
