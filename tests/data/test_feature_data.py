"""FeatureData (lmforge.data.batches): the seeded per-epoch order, and group_by_length (issue 22, item 1)."""

from __future__ import annotations

import random

import pytest
import torch

from lmforge.data.batches import GROUP_BATCHES, FeatureData, feature_length


def features(n: int = 400, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"input_ids": list(range(rng.randint(3, 120))), "i": i} for i in range(n)]


def collate(fs: list[dict]) -> dict[str, torch.Tensor]:
    width = max(len(f["input_ids"]) for f in fs)
    return {"i": torch.tensor([f["i"] for f in fs]), "width": torch.tensor(width),
            "real": torch.tensor(sum(len(f["input_ids"]) for f in fs))}


def one_epoch(data: FeatureData, mb: int) -> list[dict[str, torch.Tensor]]:
    return list(data.batches(mb))


def test_feature_length_of_every_layout():
    assert feature_length({"windows": [[1, 2, 3], [1, 2, 3, 4, 5]]}) == 5  # a choice / symmetric-pair feature
    assert feature_length({"input_ids": [1, 2, 3, 4]}) == 4
    assert feature_length({"src_ids": [1, 2], "tgt_ids": [3, 4, 5]}) == 5


def test_grouping_keeps_every_feature_once_and_cuts_padding():
    fs = features()
    plain = one_epoch(FeatureData(fs, collate, seed=3), 8)
    grouped = one_epoch(FeatureData(fs, collate, seed=3, group_by_length=True), 8)
    for batches in (plain, grouped):
        assert sorted(torch.cat([b["i"] for b in batches]).tolist()) == list(range(len(fs)))
    padded = [sum(int(b["width"]) * len(b["i"]) - int(b["real"]) for b in bs) for bs in (plain, grouped)]
    assert padded[1] < padded[0] / 4  # similar lengths in a batch: a fraction of the padding
    lengths = [[len(fs[i]["input_ids"]) for i in b["i"].tolist()] for b in grouped]
    group = GROUP_BATCHES  # inside a group of 50 batches (8 features each) the lengths only fall
    flat = [x for b in lengths[:group] for x in b]
    assert flat == sorted(flat, reverse=True)


def test_grouping_is_seeded_and_resumes_exactly():
    fs = features(300)
    a = FeatureData(fs, collate, seed=1, group_by_length=True)
    whole = [b["i"].tolist() for b in one_epoch(a, 4)] + [b["i"].tolist() for b in one_epoch(a, 4)]
    b = FeatureData(fs, collate, seed=1, group_by_length=True)
    it = b.batches(4)
    first = [next(it)["i"].tolist() for _ in range(10)]
    state = b.state_dict()
    c = FeatureData(fs, collate, seed=1, group_by_length=True)
    c.load_state_dict(state)
    rest = [x["i"].tolist() for x in c.batches(4)] + [x["i"].tolist() for x in c.batches(4)]
    assert first + rest == whole
    other = FeatureData(fs, collate, seed=2, group_by_length=True)
    assert [x["i"].tolist() for x in one_epoch(other, 4)] != whole[:len(whole) // 2]


@pytest.mark.parametrize("group", [False, True])
def test_processes_share_the_epoch(group):
    fs = features(203)
    shares = [torch.cat([b["i"] for b in one_epoch(FeatureData(fs, collate, seed=0, rank=r, world_size=2,
                                                                group_by_length=group), 4)]).tolist()
              for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == list(range(len(fs)))
    if group:  # the two processes' i-th batches come from the same sorted stretch: similar lengths
        a, b = ([len(fs[i]["input_ids"]) for i in s[:40]] for s in shares)
        assert max(abs(x - y) for x, y in zip(a, b, strict=False)) <= 3
