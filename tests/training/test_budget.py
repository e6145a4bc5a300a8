"""A time or token budget (TrainConfig.budget): the schedule on the elapsed fraction, the stop at the budget, and
exact resumption."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmforge.config import Budget, TrainConfig, parse_budget
from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer, latest_checkpoint, load_trainer_state
from lmforge.training.optim import lr_multiplier, lr_multiplier_at
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, train_config, without_timing

# ---------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("text", "kind", "amount"), [
    ("30s", "time", 30.0), ("10m", "time", 600.0), ("1.5h", "time", 5400.0), (" 2 m ", "time", 120.0),
    ("123456tok", "tokens", 123456.0), ("200ktok", "tokens", 200_000.0), ("5Mtok", "tokens", 5_000_000.0),
    ("1.5Gtok", "tokens", 1.5e9), ("2.5ktok", "tokens", 2500.0),
])
def test_budget_forms(text, kind, amount):
    assert parse_budget(text) == Budget(kind, amount)
    assert TrainConfig(budget=text).budget_spec() == Budget(kind, amount)
    assert parse_budget("") is None and TrainConfig().budget_spec() is None


@pytest.mark.parametrize("text", ["10", "10min", "5M", "tok", "0s", "0tok", "-3m", "1e3tok", "3 minutes", "nan s"])
def test_a_bad_budget_names_the_forms(text):
    with pytest.raises(LmforgeError, match=r"budget=.*(10m|tok)"):
        TrainConfig(budget=text)


def test_a_budget_refuses_warmup_steps_and_an_unscaled_inverse_sqrt():
    with pytest.raises(LmforgeError, match="warmup_steps=10 cannot be used with budget='10m'.*warmup_ratio"):
        TrainConfig(budget="10m", warmup_steps=10)
    with pytest.raises(LmforgeError, match="inverse_sqrt with budget='10m' needs warmup_ratio > 0"):
        TrainConfig(budget="10m", schedule="inverse_sqrt", warmup_ratio=0.0)
    TrainConfig(budget="10m", schedule="inverse_sqrt", warmup_ratio=0.1)  # fine


# ---------------------------------------------------------------------------------------------- the schedule
W, R = 0.2, 0.1  # warmup_ratio, min_lr_ratio


def _config(schedule: str, **overrides) -> TrainConfig:
    return TrainConfig(budget="1000tok", schedule=schedule, warmup_ratio=W, min_lr_ratio=R, **overrides)


@pytest.mark.parametrize(("schedule", "a", "b", "expected"), [
    # warm-up: a / w on the fraction after the update
    ("linear", 0.05, 0.0, 0.05 / W), ("cosine", 0.1, 0.05, 0.1 / W), ("constant", W, 0.1, 1.0),
    # linear: r + (1 - r)(1 - p), p = (b - w) / (1 - w) on the fraction before the update
    ("linear", 0.3, 0.2, 1.0), ("linear", 0.7, 0.6, R + (1 - R) * (1 - 0.4 / 0.8)),
    ("linear", 1.02, 0.95, R + (1 - R) * (1 - 0.75 / 0.8)), ("linear", 1.5, 1.2, R),
    # cosine: r + (1 - r)(1 + cos(pi p)) / 2
    ("cosine", 0.5, 0.4, R + (1 - R) * 0.5 * (1 + math.cos(math.pi * 0.2 / 0.8))),
    ("cosine", 1.01, 0.6, R + (1 - R) * 0.5 * (1 + math.cos(math.pi * 0.5))),
    ("constant", 0.9, 0.8, 1.0), ("constant", 1.3, 1.0, 1.0),
    # inverse_sqrt: min(a / w, sqrt(w / a)), floored at r
    ("inverse_sqrt", 0.1, 0.0, 0.5), ("inverse_sqrt", 0.8, 0.7, math.sqrt(W / 0.8)), ("inverse_sqrt", 50.0, 1.0, R),
])
def test_the_budget_schedule_by_formula(schedule, a, b, expected):
    assert lr_multiplier_at(a, _config(schedule), before=b) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("a", "p"), [(0.05, 0.5), (0.1, 1.0), (0.55, 0.5), (1.0, 0.0), (1.4, 0.0)])
def test_the_slanted_triangular_budget_schedule_by_formula(a, p):
    config = _config("slanted_triangular", stlr_cut_frac=0.1, stlr_ratio=32.0)
    # p = a / c for a < c, else 1 - (a - c) / (1 - c); factor (1 + p (ratio - 1)) / ratio
    assert lr_multiplier_at(a, config, before=a - 0.01) == pytest.approx((1 + p * 31) / 32, rel=1e-12)


def test_no_warmup_starts_at_the_peak_and_without_before_the_fraction_is_both():
    config = TrainConfig(budget="1m", warmup_ratio=0.0, schedule="linear")
    assert lr_multiplier_at(0.01, config, before=0.0) == 1.0
    assert lr_multiplier_at(0.5, config) == pytest.approx(0.5)


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant", "inverse_sqrt", "slanted_triangular"])
def test_a_budget_of_exactly_n_updates_gives_the_step_schedule(schedule):
    """With a = s / N, b = (s - 1) / N and w = W / N the budget schedule is lr_multiplier's for N steps."""
    n, warmup = 40, 8
    by_steps = TrainConfig(max_steps=n, warmup_steps=warmup, schedule=schedule, min_lr_ratio=0.05)
    by_budget = TrainConfig(budget="4000tok", warmup_ratio=warmup / n, schedule=schedule, min_lr_ratio=0.05)
    for s in range(1, n + 1):
        assert lr_multiplier_at(s / n, by_budget, before=(s - 1) / n) == pytest.approx(
            lr_multiplier(s, by_steps), rel=1e-9, abs=1e-12), s


# ---------------------------------------------------------------------------------------------- the Trainer
def _budget_config(**overrides) -> TrainConfig:
    return train_config(**{"max_steps": None, "warmup_steps": None, "warmup_ratio": 0.25, "budget": "300tok",
                           "eval_every": 0, **overrides})


def _trainer(out: Path, *, seed: int = 0, resume="never", **overrides) -> Trainer:
    return Trainer(tiny_decoder(seed), LMObjective(two_terms=True), ToyData(n=16, seed=3), _budget_config(**overrides),
                   RunOutput(out, resume=resume, progress=False), eval_data=ToyData(n=6, seed=4, fixed=True))


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_a_token_budget_sets_the_lr_from_the_fraction_and_stops_at_the_first_update_that_reaches_it(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.fit()
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    config = trainer.config
    before = 0.0
    for r in train:
        fraction = r["tokens"] / 300
        assert r["budget_fraction"] == fraction
        assert r["lr"] == pytest.approx(config.lr * lr_multiplier_at(fraction, config, before=before), rel=1e-12)
        before = fraction
    assert [r["step"] for r in train] == list(range(1, len(train) + 1))
    assert train[-1]["budget_fraction"] >= 1.0 > train[-2]["budget_fraction"]
    assert train[0]["lr"] > 0 and train[-1]["lr"] > 0  # neither the first nor the last update runs at lr 0
    # the final checkpoint and model, as a step-limited run writes them
    state = load_trainer_state(latest_checkpoint(tmp_path))
    assert state["step"] == len(train) and state["components"]["progress"]["budget_fraction"] >= 1.0
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "eval_results.json").is_file()
    assert any("eval_loss" in r for r in read_jsonl(tmp_path / "metrics.jsonl"))  # the final evaluation
    assert trainer.config.max_steps is None


def test_max_steps_caps_a_budget_and_step_runs_keep_their_checkpoint_keys(tmp_path):
    trainer = _trainer(tmp_path / "capped", max_steps=2)
    trainer.fit()
    assert trainer.step == 2 and trainer.progress_state.budget_fraction < 1.0
    trainer = Trainer(tiny_decoder(0), LMObjective(), ToyData(n=16, seed=3), train_config(max_steps=2),
                      RunOutput(tmp_path / "steps", progress=False))
    trainer.fit()
    progress = load_trainer_state(latest_checkpoint(tmp_path / "steps"))["components"]["progress"]
    assert set(progress) == {"step", "epoch", "tokens", "elapsed_s", "last_eval", "window"}
    assert "budget_fraction" not in read_jsonl(tmp_path / "steps" / "metrics.jsonl")[-1]


def test_resume_in_the_middle_of_a_token_budget_equals_the_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    _trainer(full, save_every=2, keep_last=0).fit()
    a = read_jsonl(full / "metrics.jsonl")
    assert [r["step"] for r in a if "loss" in r][-1] >= 5
    # a differently initialised model, resumed from step 2 into a new folder
    _trainer(tmp_path / "resumed", seed=123, resume=full / "checkpoints" / "step-2").fit()
    b = read_jsonl(tmp_path / "resumed" / "metrics.jsonl")
    assert without_timing(b) == without_timing([r for r in a if r["step"] > 2])
    for name, tensor in _weights(full).items():
        assert torch.equal(tensor, _weights(tmp_path / "resumed")[name]), name
    # stopped by a step cap half-way, then resumed without it: the same run again
    part = tmp_path / "part"
    _trainer(part, max_steps=3).fit()
    _trainer(part, resume="auto").fit()
    # (the capped run's own final evaluation at step 3 stays in its log: compare the training records)
    train = [r for r in read_jsonl(part / "metrics.jsonl") if "loss" in r]
    assert without_timing(train) == without_timing([r for r in a if "loss" in r])
    for name, tensor in _weights(full).items():
        assert torch.equal(tensor, _weights(part)[name]), name


def test_a_changed_budget_is_refused_on_resume(tmp_path):
    _trainer(tmp_path, max_steps=2).fit()
    with pytest.raises(LmforgeError, match=r"budget \(checkpoint '300tok', now '400tok'\)"):
        _trainer(tmp_path, resume="auto", budget="400tok")


def _fake_clock(trainer: Trainer, seconds_per_step: float = 1.0) -> None:
    """Training time that does not depend on the machine: each update ends ``seconds_per_step`` after the last."""
    trainer.clock.elapsed = lambda: seconds_per_step * (trainer.step + 1)


def test_a_time_budget_stops_after_the_update_that_reaches_it_and_resumes_with_the_time_left(tmp_path):
    trainer = _trainer(tmp_path / "whole", budget="5s")
    _fake_clock(trainer)
    trainer.fit()
    train = [r for r in read_jsonl(tmp_path / "whole" / "metrics.jsonl") if "loss" in r]
    assert [r["budget_fraction"] for r in train] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert (tmp_path / "whole" / "model.safetensors").is_file()
    # 2 s, then a resume continues the same schedule until the 5 s are spent
    part = _trainer(tmp_path / "part", budget="5s", max_steps=2)
    _fake_clock(part)
    part.fit()
    resumed = _trainer(tmp_path / "part", budget="5s", resume="auto")
    assert resumed.progress_state.budget_fraction == pytest.approx(0.4)
    _fake_clock(resumed)
    resumed.fit()
    assert resumed.step == 5
    again = [r for r in read_jsonl(tmp_path / "part" / "metrics.jsonl") if "loss" in r]
    assert without_timing(again) == without_timing(train)


def test_a_real_time_budget_stops(tmp_path):
    trainer = _trainer(tmp_path, budget="0.5s", eval_every=0)
    trainer.fit()
    assert trainer.progress_state.budget_fraction >= 1.0 and trainer.clock.elapsed() >= 0.5
    assert (tmp_path / "model.safetensors").is_file()


def test_a_step_checkpoint_cannot_continue_as_a_budget_run(tmp_path):
    Trainer(tiny_decoder(0), LMObjective(), ToyData(n=16, seed=3), train_config(max_steps=2),
            RunOutput(tmp_path, progress=False)).fit()
    with pytest.raises(LmforgeError, match="budget"):
        Trainer(tiny_decoder(0), LMObjective(), ToyData(n=16, seed=3), _budget_config(),
                RunOutput(tmp_path, resume="auto", progress=False))


def test_the_trainer_class_stays_small():
    """Issue 35: the Trainer is a class of small parts (the budget is ``lmforge.training.budget``)."""
    import inspect

    from lmforge.training.trainer import Trainer

    assert len(inspect.getsource(Trainer).splitlines()) < 350
