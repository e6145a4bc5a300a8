"""Freeze modes and per-parameter learning rates for fine-tuning."""

from __future__ import annotations

import pytest
import torch

from lmforge.config import ModelConfig, TrainConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.models import Encoder
from lmforge.training import build_optimizer, build_scheduler
from lmforge.training.freeze import freeze, lr_scales


def _model(n_layers: int = 3, norm_first: bool = False) -> TaskModel:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=99, d_model=12, n_heads=2, n_layers=n_layers, d_ff=37, max_seq_len=16,
                         norm_first=norm_first)
    backbone = Encoder(config)
    return TaskModel(backbone, build_head({"type": "sequence_classification", "labels": ["a", "b"]}, config,
                                          backbone))


def _trainable(model: TaskModel) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def _all(model: TaskModel, prefix: str) -> set[str]:
    return {n for n, _ in model.named_parameters() if n.startswith(prefix)}


@pytest.mark.parametrize("norm_first", [False, True])
def test_each_mode_freezes_exactly_the_intended_parameters(norm_first):
    head = _all(_model(norm_first=norm_first), "head.")
    everything = {n for n, _ in _model(norm_first=norm_first).named_parameters()}
    embeddings = _all(_model(norm_first=norm_first), "backbone.embeddings.")
    layer = {i: _all(_model(norm_first=norm_first), f"backbone.layers.{i}.") for i in range(3)}
    top = everything - head - embeddings - set().union(*layer.values())  # pooler (+ final norm when pre-LN)
    assert top and ("backbone.final_norm.weight" in top) == norm_first
    expected = {"none": everything, "all": head, "embeddings": everything - embeddings,
                "all-but-last:0": head | top, "all-but-last:1": head | top | layer[2],
                "all-but-last:2": head | top | layer[1] | layer[2],
                "all-but-last:3": everything - embeddings}
    for mode, want in expected.items():
        model = _model(norm_first=norm_first)
        frozen = freeze(model, mode)
        assert _trainable(model) == want, mode
        assert set(frozen) == everything - want, mode


def test_freeze_errors():
    with pytest.raises(LmforgeError, match="only 3 layers"):
        freeze(_model(), "all-but-last:4")
    with pytest.raises(LmforgeError, match="all-but-last:K"):
        freeze(_model(), "some")
    with pytest.raises(LmforgeError, match="TaskModel"):
        freeze(_model().backbone, "all")


def test_frozen_parameters_do_not_move_and_get_no_optimizer_state():
    model = _model()
    freeze(model, "embeddings")
    config = TrainConfig(lr=1e-2, max_steps=3, warmup_steps=0)
    optimizer = build_optimizer(model, config)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(5, 99, (3, 7))
    for _ in range(2):
        model(ids, labels=torch.tensor([0, 1, 0])).loss_sum.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, param in model.named_parameters():
        moved = not torch.equal(before[name], param)
        assert moved == (not name.startswith("backbone.embeddings.")), name
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(_trainable(model))


def test_layer_wise_decay_and_head_lr():
    model = _model(n_layers=3)
    scales = lr_scales(model, lr=1e-4, head_lr=1e-3, layer_decay=0.5)
    assert scales["head.classifier.weight"] == pytest.approx(10.0)
    assert scales["backbone.pooler.dense.weight"] == 1.0
    assert scales["backbone.layers.2.ffn.fc1.weight"] == 0.5
    assert scales["backbone.layers.1.ffn.fc1.weight"] == 0.25
    assert scales["backbone.layers.0.ffn.fc1.weight"] == 0.125
    assert scales["backbone.embeddings.tokens.weight"] == 0.0625
    assert set(lr_scales(model, lr=1e-4).values()) == {1.0}
    freeze(model, "all")
    assert set(lr_scales(model, lr=1e-4, layer_decay=0.5)) == _all(model, "head.")


def test_optimizer_groups_follow_the_scales_through_the_schedule():
    model = _model(n_layers=2)
    config = TrainConfig(lr=1e-3, max_steps=10, warmup_steps=2, weight_decay=0.1)
    scales = lr_scales(model, lr=config.lr, head_lr=4e-3, layer_decay=0.5)
    optimizer = build_optimizer(model, config, scales)
    scheduler = build_scheduler(optimizer, config)
    by_param = {id(p): n for n, p in model.named_parameters()}
    for _ in range(4):
        for group in optimizer.param_groups:
            for param in group["params"]:
                name = by_param[id(param)]
                assert group["lr"] == pytest.approx(optimizer.param_groups[0]["lr"] * scales[name])
                decays = not (name.endswith("bias") or "norm" in name)
                assert group["weight_decay"] == (0.1 if decays else 0.0), name
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["weight_decay"] == 0.1 and all(
        scales[by_param[id(p)]] == 1.0 for p in optimizer.param_groups[0]["params"])


def test_everything_frozen_is_an_error():
    model = _model()
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(LmforgeError, match="everything is frozen"):
        build_optimizer(model, TrainConfig())
