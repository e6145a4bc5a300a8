"""Two gloo processes (launched with the environment torchrun sets) train exactly like one process with the same
global batch; distributed helpers are no-ops in a single process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer, init_distributed
from tests.training.helpers import LMObjective, read_jsonl, without_timing
from tests.training.worker import build

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_process_without_torchrun_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    info = init_distributed()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (0, 1, 0, True)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(LmforgeError, match="RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT not set"):
        init_distributed()


def test_two_gloo_processes_equal_one_process(tmp_path):
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.training.worker", str(tmp_path / "ddp"), "tiny"],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    # meanwhile, the same global batches in this process: 4 micro-batches of 2 instead of 2 per process
    model, data, eval_data, config = build("tiny", rank=0, world=1)
    Trainer(model, LMObjective(two_terms=True), data, config, RunOutput(tmp_path / "single", progress=False),
            eval_data=eval_data).fit()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err

    ddp = load_file(str(tmp_path / "ddp" / "model.safetensors"))
    single = model.state_dict()
    assert ddp.keys() == single.keys()
    assert max(float((ddp[k] - single[k]).abs().max()) for k in ddp) < 1e-6
    # the logged losses and metrics are global (all-reduced), so they match too
    a, b = without_timing(read_jsonl(tmp_path / "ddp" / "metrics.jsonl")), \
        without_timing(read_jsonl(tmp_path / "single" / "metrics.jsonl"))
    assert [r["step"] for r in a] == [1, 2, 3, 3] and "eval_loss" in a[-1]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys() and ra.get("tokens") == rb.get("tokens")
        assert all(ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6) for k in ra)
    state = torch.load(tmp_path / "ddp" / "checkpoints" / "step-3" / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["data"]) == 2 and len(state["rng"]) == 2
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # each rank has its own stream


def test_two_torchrun_nodes_on_one_machine_equal_one_process(tmp_path):
    """Two ``torchrun --nnodes 2`` launches meeting at 127.0.0.1 behave as two machines of one job."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launches = [subprocess.Popen(
        [str(torchrun), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "tests.training.worker", str(tmp_path / "nodes"), "tiny"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in range(2)]
    model, data, eval_data, config = build("tiny", rank=0, world=1)
    Trainer(model, LMObjective(two_terms=True), data, config, RunOutput(tmp_path / "single", progress=False),
            eval_data=eval_data).fit()
    for proc in launches:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
    nodes = load_file(str(tmp_path / "nodes" / "model.safetensors"))
    single = model.state_dict()
    assert max(float((nodes[k] - single[k]).abs().max()) for k in nodes) < 1e-6
    state = torch.load(tmp_path / "nodes" / "checkpoints" / "step-3" / "trainer_state.pt", weights_only=True)
    assert state["world_size"] == 2
