"""Cramming's batch-size ramp (``TrainConfig.batch_ramp``): the batch grows linearly, in whole micro-batches, from one
per process to ``batch_size`` over the first share of the run, and a resumed run ramps as an uninterrupted one."""

import math

import pytest
import torch
from safetensors.torch import load_file

from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer
from lmforge.training.budget import RunLimit
from lmforge.training.state import Progress
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, train_config, without_timing


@pytest.mark.parametrize(("step", "expected"), [(0, 1), (1, 1), (2, 2), (3, 3), (4, 4), (5, 4), (9, 4)])
def test_the_accumulation_by_formula_over_the_steps(step, expected):
    config = train_config(max_steps=10, batch_ramp=0.5)  # full: batch 8 = micro 2 x 4 micro-batches
    limit = RunLimit(config, Progress(step=step))
    assert limit.accumulation(4) == expected == max(1, min(4, math.ceil(4 * (step / 10) / 0.5)))


def test_with_a_budget_the_ramp_follows_its_fraction():
    config = train_config(max_steps=None, budget="1000tok", warmup_steps=None, batch_ramp=0.25)
    for fraction, expected in ((0.0, 1), (0.05, 1), (0.1, 2), (0.2, 4), (0.3, 5)):
        assert RunLimit(config, Progress(budget_fraction=fraction)).accumulation(5) == expected
    assert RunLimit(train_config(batch_ramp=0.0), Progress()).accumulation(4) == 4  # no ramp: the full batch


def test_a_bad_ramp_is_refused():
    with pytest.raises(LmforgeError, match=r"batch_ramp=1.5 must be in \[0, 1\]"):
        TrainConfig(batch_ramp=1.5)


def _trainer(out, **overrides) -> Trainer:
    resume = overrides.pop("resume", "never")
    config = train_config(max_steps=6, batch_ramp=0.5, save_every=2, **overrides)
    return Trainer(tiny_decoder(0), LMObjective(), ToyData(n=48, seed=3), config,
                   RunOutput(out, resume=resume, progress=False))


def test_a_ramped_run_grows_its_batch_and_resumes_exactly(tmp_path):
    _trainer(tmp_path / "full").fit()
    records = [r for r in read_jsonl(tmp_path / "full" / "metrics.jsonl") if "loss" in r]
    tokens = [b["tokens"] - a["tokens"] for a, b in zip([{"tokens": 0}, *records], records, strict=False)]
    assert tokens[0] < tokens[-1]  # one micro-batch first, four at the end
    _trainer(tmp_path / "resumed", resume=tmp_path / "full" / "checkpoints" / "step-2").fit()
    again = [r for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl") if "loss" in r]
    assert without_timing(again) == without_timing([r for r in records if r["step"] > 2])
    full, resumed = (load_file(str(p / "model.safetensors")) for p in (tmp_path / "full", tmp_path / "resumed"))
    assert all(torch.equal(full[name], resumed[name]) for name in full)
