"""Checkpoints by default: the default step / time cadence, its cost guard, and a checkpoint on SIGTERM / SIGINT that
``--resume auto`` continues exactly."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file

import lmforge.training.cadence as cadence_module
from lmforge.config import DEFAULT_SAVE_EVERY, DEFAULT_SAVE_MINUTES
from lmforge.training import RunOutput, Trainer
from lmforge.training.trainer import TrainingInterrupted
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, train_config, without_timing


def _steps(out) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").iterdir() if p.name.startswith("step-"))


def _trainer(out, objective=None, resume="never", **overrides) -> Trainer:
    config = train_config(**{"max_steps": 7, "batch_size": 4, "keep_last": 0, "save_every": None, **overrides})
    return Trainer(tiny_decoder(0), objective or LMObjective(), ToyData(n=16, seed=3), config,
                   RunOutput(out, resume=resume, progress=False))


def test_the_default_cadence_keeps_checkpoints_without_any_option(tmp_path, monkeypatch):
    assert (DEFAULT_SAVE_EVERY, DEFAULT_SAVE_MINUTES) == (500, 10.0)  # what --help shows
    monkeypatch.setattr(cadence_module, "DEFAULT_SAVE_EVERY", 3)  # the cadence, scaled down to this toy run
    monkeypatch.setattr(cadence_module, "SAVE_COST_FACTOR", 0.0)  # toy steps are faster than a write (tested below)
    _trainer(tmp_path / "run").fit()
    assert _steps(tmp_path / "run") == [3, 6, 7]
    # an explicit cadence replaces the default one; 0 keeps only the final checkpoint
    _trainer(tmp_path / "two", save_every=2).fit()
    assert _steps(tmp_path / "two") == [2, 4, 6, 7]
    _trainer(tmp_path / "none", save_every=0).fit()
    assert _steps(tmp_path / "none") == [7]


def test_the_time_cadence_and_its_cost_guard(tmp_path, monkeypatch):
    monkeypatch.setattr(cadence_module, "SAVE_COST_FACTOR", 0.0)
    _trainer(tmp_path / "timed", save_every=0, save_minutes=1e-9).fit()  # due after every step
    assert _steps(tmp_path / "timed") == list(range(1, 8))
    # a default-cadence checkpoint waits until SAVE_COST_FACTOR x the last write's time has passed: with a huge
    # factor only the first one (no write measured yet) and the final one are written
    monkeypatch.setattr(cadence_module, "SAVE_COST_FACTOR", 1e9)
    monkeypatch.setattr(cadence_module, "DEFAULT_SAVE_EVERY", 1)
    _trainer(tmp_path / "guarded").fit()
    assert _steps(tmp_path / "guarded") == [1, 7]


class SignalAt(LMObjective):
    """Sends this process ``signum`` during its ``at``-th call (a micro-batch in the middle of a step)."""

    def __init__(self, at: int, signum: int, times: int = 1) -> None:
        super().__init__()
        self.at, self.signum, self.times = at, signum, times

    def __call__(self, model, batch):
        if self.at <= self.calls + 1 < self.at + self.times:
            os.kill(os.getpid(), self.signum)
        return super().__call__(model, batch)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_step_saves_a_checkpoint_and_resume_auto_continues_exactly(tmp_path, signum):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    _trainer(whole, save_every=0).fit()
    previous = signal.getsignal(signum)
    # 2 micro-batches per step: the signal arrives during call 7, the first micro-batch of step 4
    with pytest.raises(TrainingInterrupted) as caught:
        _trainer(stopped, SignalAt(7, signum), save_every=0).fit()
    assert signal.getsignal(signum) is previous  # the handler is put back
    assert caught.value.exit_code == 128 + signum and caught.value.checkpoint == stopped / "checkpoints" / "step-4"
    assert "--resume auto" in str(caught.value) and signal.Signals(signum).name in str(caught.value)
    assert _steps(stopped) == [4] and not (stopped / "model.safetensors").exists()
    _trainer(stopped, resume="auto", save_every=0).fit()
    assert without_timing(read_jsonl(whole / "metrics.jsonl")) == without_timing(read_jsonl(stopped / "metrics.jsonl"))
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(stopped / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_stops_at_once(tmp_path):
    with pytest.raises(TrainingInterrupted) as caught:  # two SIGTERMs within step 4
        _trainer(tmp_path / "run", SignalAt(7, signal.SIGTERM, times=2), save_every=0).fit()
    assert caught.value.checkpoint is None and "stopped at once" in str(caught.value)
    assert not (tmp_path / "run" / "checkpoints").exists() or _steps(tmp_path / "run") == []
