"""AdamW parameter groups and learning-rate schedules at specific steps."""

from __future__ import annotations

import math

import pytest
import torch

from lmforge.training import build_optimizer, build_scheduler, decay_parameter_names, lr_multiplier
from tests.training.helpers import tiny_decoder, tiny_lm, train_config


def _config(schedule: str, **overrides):
    return train_config(schedule=schedule, max_steps=110, warmup_steps=10, lr=1.0, **overrides)


@pytest.mark.parametrize(("step", "expected"), [(1, 0.1), (5, 0.5), (10, 1.0), (11, 1.0), (61, 0.5), (110, 0.01),
                                                 (111, 0.0), (500, 0.0)])
def test_linear_warmup_then_decay(step, expected):
    # warm-up reaches the peak at update 10; the decay counts completed updates, so 11 is still at the peak and the
    # last update (110) runs at 1/100, not 0
    assert lr_multiplier(step, _config("linear")) == pytest.approx(expected)


def test_linear_decays_to_min_lr_ratio():
    config = _config("linear", min_lr_ratio=0.1)
    assert lr_multiplier(61, config) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_multiplier(111, config) == pytest.approx(0.1)
    assert lr_multiplier(10_000, config) == pytest.approx(0.1)


@pytest.mark.parametrize(("step", "expected"), [(3, 0.3), (10, 1.0), (11, 1.0), (36, (1 + math.cos(math.pi / 4)) / 2),
                                                 (61, 0.5), (86, (1 + math.cos(3 * math.pi / 4)) / 2), (111, 0.0)])
def test_cosine(step, expected):
    assert lr_multiplier(step, _config("cosine")) == pytest.approx(expected)


def test_cosine_floor_and_constant():
    assert lr_multiplier(61, _config("cosine", min_lr_ratio=0.2)) == pytest.approx(0.2 + 0.8 * 0.5)
    assert [lr_multiplier(s, _config("constant")) for s in (1, 10, 11, 110, 1000)] == [0.1, 1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(("step", "expected"), [(1, 0.1), (10, 1.0), (40, 0.5), (160, 0.25), (1000, 0.1)])
def test_inverse_sqrt_is_vaswani(step, expected):
    # Vaswani et al.: d^-0.5 * min(step^-0.5, step * warmup^-1.5), normalised so the peak (step = warmup) is 1
    assert lr_multiplier(step, _config("inverse_sqrt")) == pytest.approx(expected)
    vaswani = min(step ** -0.5, step * 10 ** -1.5) / 10 ** -0.5
    assert lr_multiplier(step, _config("inverse_sqrt")) == pytest.approx(vaswani)


def test_warmup_ratio_and_no_warmup():
    config = train_config(schedule="linear", max_steps=200, warmup_steps=None, warmup_ratio=0.05, lr=1.0)
    assert config.warmup() == 10 and lr_multiplier(5, config) == pytest.approx(0.5)
    no_warmup = train_config(schedule="linear", max_steps=4, warmup_steps=0, lr=1.0)
    assert [lr_multiplier(s, no_warmup) for s in (1, 2, 3, 4)] == pytest.approx([1.0, 0.75, 0.5, 0.25])
    one_step = train_config(schedule="linear", max_steps=1, warmup_steps=None, lr=1.0)
    assert lr_multiplier(1, one_step) == 1.0  # a 1-step run still moves the weights


def test_scheduler_follows_the_pure_function():
    config = _config("cosine", min_lr_ratio=0.05)
    model = tiny_lm()
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    seen = []
    for _ in range(115):
        seen.append(optimizer.param_groups[0]["lr"])  # the lr of the coming update
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([lr_multiplier(s, config) for s in range(1, 116)])
    assert all(g["lr"] == optimizer.param_groups[0]["lr"] for g in optimizer.param_groups)


def test_no_weight_decay_on_biases_and_layer_norm():
    model = tiny_decoder()
    decay, no_decay = decay_parameter_names(model)
    assert all(n.endswith("bias") or "norm" in n for n in no_decay)
    assert {"final_norm.weight", "final_norm.bias", "layers.0.ffn.fc1.bias", "layers.1.self_attn_norm.weight"} <= \
        set(no_decay)
    assert {"token_embedding.weight", "position_embedding.weight", "layers.0.ffn.fc1.weight",
            "layers.1.self_attn.q_proj.weight"} <= set(decay)
    assert all(p.ndim >= 2 for n, p in model.named_parameters() if n in decay)
    assert len(decay) + len(no_decay) == len(list(model.parameters()))  # the tied LM head is counted once

    optimizer = build_optimizer(model, train_config(weight_decay=0.1))
    groups = {g["weight_decay"]: {id(p) for p in g["params"]} for g in optimizer.param_groups}
    params = dict(model.named_parameters())
    assert groups[0.1] == {id(params[n]) for n in decay} and groups[0.0] == {id(params[n]) for n in no_decay}


def test_decay_really_skips_no_decay_parameters():
    model = tiny_lm()
    optimizer = build_optimizer(model, train_config(weight_decay=0.5, lr=0.1))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # zero gradients: only weight decay moves anything
    after = dict(model.named_parameters())
    for name in ("norm.weight", "norm.bias", "proj.bias", "out.bias"):
        assert torch.equal(after[name], before[name]), name
    for name in ("embed.weight", "proj.weight", "out.weight"):
        assert torch.allclose(after[name], before[name] * (1 - 0.1 * 0.5)), name
