"""Checkpoint -> resume gives the very run that was never interrupted: same losses at every step, same weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer, latest_checkpoint, load_trainer_state
from tests.training.helpers import (
    LMObjective,
    ToyData,
    read_jsonl,
    tiny_decoder,
    train_config,
    without_timing,
)

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, *, seed: int = 0, resume="never", data_seed: int = 3, **overrides) -> dict:
    config = train_config(**{"max_steps": 4, "save_every": 2, "eval_every": 2, **overrides})
    trainer = Trainer(tiny_decoder(seed), LMObjective(two_terms=True), ToyData(n=16, seed=data_seed), config,
                      RunOutput(out, resume=resume, progress=False), eval_data=ToyData(n=6, seed=4, fixed=True))
    return trainer.fit()


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_save_load_gives_identical_next_steps(tmp_path):
    full = tmp_path / "full"
    _run(full)
    # a differently initialised model, resumed from step 2 of the first run into a new folder
    _run(tmp_path / "resumed", seed=123, resume=full / "checkpoints" / "step-2")
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in b] == [3, 4, 4]  # train 3, train 4, eval 4 (the final eval is not repeated)
    assert without_timing(b) == without_timing([r for r in a if r["step"] > 2])
    for name, tensor in _weights(full).items():
        assert torch.equal(tensor, _weights(tmp_path / "resumed")[name]), name


def test_checkpoint_state_is_weights_only(tmp_path):
    _run(tmp_path, max_steps=2)
    state = load_trainer_state(latest_checkpoint(tmp_path))  # torch.load(weights_only=True) inside
    assert state["step"] == 2 and state["world_size"] == 1
    assert state["data"] == [{"epoch": 0, "pos": 16}] and len(state["rng"]) == 1
    assert set(state["rng"][0]) == {"torch", "cuda", "numpy", "python"}
    assert state["train_config"]["batch_size"] == 8 and state["model_config"]["d_model"] == 12


def test_resume_auto_continues_and_max_steps_may_grow(tmp_path):
    full = tmp_path / "full"
    _run(full, schedule="constant", max_steps=4)
    part = tmp_path / "part"
    _run(part, schedule="constant", max_steps=2)
    _run(part, schedule="constant", max_steps=4, resume="auto", save_every=3)
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(part / "metrics.jsonl")
    assert without_timing(a) == without_timing(b)


def test_a_longer_schedule_on_resume_sets_the_lr_of_the_new_schedule(tmp_path):
    # linear decay to 0 at max_steps: the checkpoint of a 2-step run holds lr 0; resumed with max_steps 4, step 3 must
    # train at the 4-step schedule's lr for step 3, as an uninterrupted 4-step run does (not at the stale 0)
    from lmforge.training.optim import lr_multiplier

    _run(tmp_path / "part", schedule="linear", max_steps=2, warmup_ratio=0.0)
    _run(tmp_path / "part", schedule="linear", max_steps=4, warmup_ratio=0.0, resume="auto")
    _run(tmp_path / "full", schedule="linear", max_steps=4, warmup_ratio=0.0)
    resumed = {r["step"]: r["lr"] for r in read_jsonl(tmp_path / "part" / "metrics.jsonl") if "lr" in r}
    full = {r["step"]: r["lr"] for r in read_jsonl(tmp_path / "full" / "metrics.jsonl") if "lr" in r}
    config = train_config(schedule="linear", max_steps=4, warmup_ratio=0.0)
    assert resumed[3] > 0 and resumed[3] == pytest.approx(config.lr * lr_multiplier(3, config))
    assert resumed[3] == pytest.approx(full[3]) and resumed[4] == pytest.approx(full[4])


def test_resume_with_changed_settings_names_them(tmp_path):
    _run(tmp_path, max_steps=2)
    with pytest.raises(LmforgeError) as err:
        _run(tmp_path, resume="auto", batch_size=4, lr=0.5, max_steps=9, log_every=3)
    message = str(err.value)
    assert "batch_size (checkpoint 8, now 4)" in message and "lr (checkpoint 0.01, now 0.5)" in message
    assert "max_steps (" not in message and "log_every (" not in message  # allowed to change
    config = train_config(max_steps=4, save_every=2, eval_every=2)
    with pytest.raises(LmforgeError, match=r"model\.d_model \(checkpoint 12, now 16\)"):
        Trainer(tiny_decoder(d_model=16), LMObjective(two_terms=True), ToyData(n=16), config,
                RunOutput(tmp_path, resume="auto", progress=False))


def test_partial_checkpoint_is_ignored_and_auto_without_checkpoint_starts_fresh(tmp_path):
    (tmp_path / "checkpoints" / ".tmp-step-7-999").mkdir(parents=True)
    (tmp_path / "checkpoints" / ".tmp-step-7-999" / "junk").write_text("half written")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 99.0}\n{"step": 2, "lo')  # a killed run's lines
    _run(tmp_path, resume="auto", max_steps=2, save_every=0, eval_every=0)
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 2] and lines[0]["loss"] != 99.0  # train 1, train 2, final eval
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert latest_checkpoint(tmp_path).name == "step-2"


def _worker(out: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen([sys.executable, "-m", "tests.training.worker", str(out), "decoder", *extra], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> int:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, -signal.SIGKILL), err
    return proc.returncode


def test_kill_9_then_resume_auto_equals_uninterrupted_run(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # 10 steps of 2 micro-batches; checkpoints every 3 steps (keep 2), eval every 4. The killed run asks for its
    # 15th micro-batch (the first of step 8) and dies by SIGKILL: checkpoint step-6 exists, step 7 was logged.
    procs = [_worker(whole), _worker(killed, "--die-at", "15")]
    assert [_finish(p) for p in procs] == [0, -signal.SIGKILL]
    assert latest_checkpoint(killed).name == "step-6"
    assert not (killed / "model.safetensors").exists()
    assert max(r["step"] for r in read_jsonl(killed / "metrics.jsonl")) == 7
    assert _finish(_worker(killed, "--resume", "auto")) == 0

    a, b = read_jsonl(whole / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [r["step"] for r in a if "loss" in r] == list(range(1, 11))
    assert without_timing(a) == without_timing(b)
    wa, wb = _weights(whole), _weights(killed)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step-10", "step-9"]
