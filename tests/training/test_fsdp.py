"""parallel = "fsdp" (FSDP2, fully_shard): two gloo processes holding half of every parameter train like one process
with the same global batch, write the same (gathered) files, and resume exactly after a kill -9."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmforge.persistence import load_pretrained
from lmforge.training import RunOutput, Trainer
from tests.training.helpers import LMObjective, read_jsonl, without_timing
from tests.training.worker import build

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("torch.distributed.fsdp", reason="this torch has no torch.distributed.fsdp")
if not hasattr(__import__("torch.distributed.fsdp", fromlist=["fully_shard"]), "fully_shard"):
    pytest.skip("this torch has no FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6)", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, *extra: str) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.training.worker", str(out), "sharded",
                                       "--parallel", "fsdp", *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs: list[subprocess.Popen], outputs: list[str] | None = None) -> list[int]:
    codes = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        # a process whose peer was killed first may also abort inside gloo ("terminate called ..."): SIGABRT
        assert proc.returncode in (0, -signal.SIGKILL, -signal.SIGABRT, 1), err
        codes.append(proc.returncode)
        if outputs is not None:
            outputs.append(out)
    return codes


def test_two_sharded_processes_equal_one_process(tmp_path):
    procs = _launch(tmp_path / "fsdp")
    model, data, eval_data, config = build("sharded", rank=0, world=1)
    Trainer(model, LMObjective(two_terms=True), data, config, RunOutput(tmp_path / "single", progress=False),
            eval_data=eval_data).fit()
    outputs: list[str] = []
    assert _finish(procs, outputs) == [0, 0]
    total = sum(p.numel() for p in model.parameters())
    held = [int(out.split(" holds ")[1].split()[0]) for out in outputs]
    assert all("sharded=True" in out for out in outputs) and sum(held) == total and max(held) < total

    sharded = load_file(str(tmp_path / "fsdp" / "model.safetensors"))
    single = load_file(str(tmp_path / "single" / "model.safetensors"))
    assert sharded.keys() == single.keys()  # the same file: gathered, the tied embedding stored once
    assert max(float((sharded[k] - single[k]).abs().max()) for k in single) < 1e-5
    loaded = load_pretrained(tmp_path / "fsdp")
    assert loaded.config == model.config and not any(hasattr(p, "full_tensor") for p in loaded.model.parameters())
    a = without_timing(read_jsonl(tmp_path / "fsdp" / "metrics.jsonl"))
    b = without_timing(read_jsonl(tmp_path / "single" / "metrics.jsonl"))
    assert [r["step"] for r in a] == [r["step"] for r in b] and any("eval_loss" in r for r in a)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        assert all(ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-5) for k in ra), (ra, rb)
    # a checkpoint holds the full optimizer state (keyed by parameter name) and both ranks' data positions
    state = torch.load(tmp_path / "fsdp" / "checkpoints" / "step-4" / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and state["train_config"]["parallel"] == "fsdp"
    moments = state["components"]["optimizer"]["state"]
    assert "token_embedding.weight" in moments
    assert moments["token_embedding.weight"]["exp_avg"].shape == single["token_embedding.weight"].shape


def test_a_killed_sharded_run_resumes_exactly(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert _finish(_launch(whole)) == [0, 0]
    # 6 steps of 2 micro-batches per process; checkpoints every 2 steps. Each process dies by SIGKILL when it asks
    # for its 9th micro-batch (the first of step 5): checkpoint step-4 is the last one.
    codes = _finish(_launch(killed, "--die-at", "9"))
    assert -signal.SIGKILL in codes, codes
    assert sorted(p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith("step-"))[-1] == "step-4"
    assert not (killed / "model.safetensors").exists()
    assert _finish(_launch(killed, "--resume", "auto")) == [0, 0]
    a, b = read_jsonl(whole / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [r["step"] for r in b if "loss" in r][-2:] == [5, 6]
    assert without_timing([r for r in a if r["step"] > 4]) == without_timing([r for r in b if r["step"] > 4])
    wa = load_file(str(whole / "model.safetensors"))
    wb = load_file(str(killed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
