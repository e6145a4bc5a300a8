"""The Trainer: exact gradient accumulation, the run folder it writes, its refusals and errors, overfitting."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.persistence import load_pretrained
from lmforge.training import ObjectiveOutput, RunOutput, Trainer, latest_checkpoint
from tests.training.helpers import (
    LMObjective,
    ToyData,
    read_jsonl,
    tiny_decoder,
    tiny_lm,
    train_config,
    without_timing,
)

REQUIRED_TRAIN_KEYS = {"step", "epoch", "loss", "loss_lm", "lm_accuracy", "lr", "grad_norm", "tokens_per_s", "tokens",
                       "elapsed_s"}


# ---------------------------------------------------------------------------------------------- accumulation
def _sgd_like(**overrides):
    # eps = 1 makes AdamW's first update lr * g / (|g| + 1), close to linear in the gradient: with the default eps
    # the first Adam update is lr * sign(g) and would hide a wrong gradient scale.
    values = dict(max_steps=1, batch_size=32, lr=1.0, eps=1.0, weight_decay=0.0, max_grad_norm=0.0,
                  schedule="constant", warmup_steps=0, save_every=0)
    return train_config(**{**values, **overrides})


def _trainer_step(tmp_path, micro_batch_size: int) -> dict[str, torch.Tensor]:
    model = tiny_lm()
    Trainer(model, LMObjective(two_terms=True), ToyData(n=32, seed=5), _sgd_like(micro_batch_size=micro_batch_size),
            RunOutput(tmp_path / f"micro{micro_batch_size}", progress=False)).fit()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _manual_step(micro_batch_size: int, naive: bool) -> dict[str, torch.Tensor]:
    """One AdamW step by hand: naive = mean loss per micro-batch, averaged over micro-batches (the bug)."""
    model, objective = tiny_lm(), LMObjective(two_terms=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0, eps=1.0, weight_decay=0.0)
    micro = list(ToyData(n=32, seed=5).batches(micro_batch_size))
    for batch in micro:
        losses, _ = objective(model, batch)
        loss = sum(total / count for total, count in losses.values())
        (loss / len(micro) if naive else loss).backward()
    optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_accumulating_4_x_8_equals_one_batch_of_32(tmp_path):
    counts = [LMObjective().counts(b)["lm"] for b in ToyData(n=32, seed=5).batches(8)]
    assert len(counts) == 4 and len(set(counts)) > 1, counts  # micro-batches predict different numbers of tokens
    accumulated, whole = _trainer_step(tmp_path, 8), _trainer_step(tmp_path, 32)
    assert _max_diff(accumulated, whole) < 1e-6
    assert _max_diff(whole, _manual_step(32, naive=False)) < 1e-6  # and both are the textbook full-batch step
    # averaging per-micro-batch means is measurably different: this test would catch it
    assert _max_diff(_manual_step(8, naive=True), whole) > 1e-4


# ---------------------------------------------------------------------------------------------- the run folder
def test_run_folder_metrics_curve_checkpoints_and_final_model(tmp_path):
    model, run_config = tiny_decoder(), {"train": {"note": "resolved"}, "data": {"path": "x"}}
    config = train_config(max_steps=4, log_every=2, eval_every=2, save_every=2, keep_last=1)
    result = Trainer(model, LMObjective(), ToyData(n=16), config, RunOutput(tmp_path, run_config=run_config,
                     progress=False), eval_data=ToyData(n=6, seed=9, fixed=True)).fit()

    lines = read_jsonl(tmp_path / "metrics.jsonl")
    train = [r for r in lines if "loss" in r]
    evals = [r for r in lines if "eval_loss" in r]
    assert [r["step"] for r in train] == [2, 4] and [r["step"] for r in evals] == [2, 4]
    assert all(REQUIRED_TRAIN_KEYS <= set(r) for r in train)
    assert all(r["loss"] == pytest.approx(r["loss_lm"]) and 0 <= r["lm_accuracy"] <= 1 for r in train)
    assert train[0]["lr"] == pytest.approx(1e-2 * lr_at(2, 4, 1)) and train[0]["tokens"] > 0
    for r in evals:
        assert set(r) == {"step", "eval_loss", "eval_loss_lm", "eval_ppl_lm", "eval_lm_accuracy"}
        assert r["eval_ppl_lm"] == pytest.approx(math.exp(r["eval_loss_lm"]))
    assert result["step"] == 4 and result["eval_loss"] == evals[-1]["eval_loss"] and "loss" in result

    png = (tmp_path / "loss_curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(tmp_path / "loss_curve.png") as image:
        image.verify()
        assert image.size[0] > 100 and image.size[1] > 100

    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-4"]  # keep_last = 1
    assert {p.name for p in latest_checkpoint(tmp_path).iterdir()} == {"model.safetensors", "config.json",
                                                                       "trainer_state.pt"}
    loaded = load_pretrained(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name
    assert json.loads((tmp_path / "run_config.json").read_text()) == run_config
    assert json.loads((tmp_path / "eval_results.json").read_text()) == evals[-1]


def lr_at(step: int, max_steps: int, warmup: int) -> float:
    from lmforge.training import lr_multiplier

    return lr_multiplier(step, train_config(max_steps=max_steps, warmup_steps=warmup))


def test_model_without_model_config_saves_weights_only(tmp_path):
    model = tiny_lm()
    Trainer(model, LMObjective(), ToyData(n=8), train_config(max_steps=1, save_every=1),
            RunOutput(tmp_path, progress=False)).fit()
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "config.json").exists()
    assert (latest_checkpoint(tmp_path) / "trainer_state.pt").is_file()


def test_refuses_an_out_dir_holding_a_run_and_overwrite_moves_it_aside(tmp_path):
    out = tmp_path / "run"
    config = train_config(max_steps=1)
    Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(out, progress=False)).fit()
    with pytest.raises(LmforgeError, match=r"already holds a training run.*--resume auto.*--overwrite"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(out, progress=False))
    with pytest.raises(LmforgeError, match="exclude each other"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config,
                RunOutput(out, resume="auto", overwrite=True, progress=False))
    Trainer(tiny_lm(), LMObjective(), ToyData(n=8), train_config(max_steps=2),
            RunOutput(out, overwrite=True, progress=False)).fit()
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    (aside,) = tmp_path.glob("run.old-*")
    assert [r["step"] for r in read_jsonl(aside / "metrics.jsonl")] == [1]


def test_resume_from_an_older_checkpoint_inside_the_run_is_refused(tmp_path):
    config = train_config(max_steps=2, save_every=1)
    Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(tmp_path, progress=False)).fit()
    with pytest.raises(LmforgeError, match="later checkpoints exist"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config,
                RunOutput(tmp_path, resume=tmp_path / "checkpoints" / "step-1", progress=False))


def test_the_keywords_before_run_output_still_work_for_one_release_and_warn(tmp_path):
    config = train_config(max_steps=2, save_every=1)
    Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(tmp_path / "new", progress=False)).fit()
    deprecated = r"Trainer\(resume=, progress=\.\.\.\) is deprecated.*RunOutput"
    with pytest.warns(DeprecationWarning, match=deprecated) as seen:
        old = Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, tmp_path / "old", resume="never", progress=False)
    assert seen[0].filename == __file__  # the warning names the caller's line, not lmforge's
    assert old.output == RunOutput(tmp_path / "old", resume="never", progress=False)
    old.fit()
    assert without_timing(read_jsonl(tmp_path / "old" / "metrics.jsonl")) == \
        without_timing(read_jsonl(tmp_path / "new" / "metrics.jsonl"))  # the same run either way
    with pytest.warns(DeprecationWarning):  # the folder under its old keyword name
        assert Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, out_dir=tmp_path / "kw").out_dir == \
            tmp_path / "kw"
    with pytest.raises(TypeError, match="inside the RunOutput"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(tmp_path / "x"), progress=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'progres'"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, tmp_path / "x", progres=False)


# ---------------------------------------------------------------------------------------------- errors
def test_batch_size_must_divide(tmp_path):
    with pytest.raises(LmforgeError, match=r"batch_size=10 .*micro_batch_size=4 x world_size=1"):
        Trainer(tiny_lm(), LMObjective(), ToyData(), train_config(batch_size=10, micro_batch_size=4), tmp_path)


def test_nan_loss_stops_with_the_step_and_saves_nothing_corrupt(tmp_path):
    model = tiny_lm()
    config = train_config(max_steps=5, batch_size=4, micro_batch_size=2, save_every=1)
    trainer = Trainer(model, LMObjective(nan_at_call=5), ToyData(n=16), config, RunOutput(tmp_path, progress=False))
    with pytest.raises(LmforgeError, match=r"diverged: the loss is nan at step 3 .*lower the learning rate \(--lr"):
        trainer.fit()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert not (tmp_path / "model.safetensors").exists()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_objective_counts_must_match_its_losses(tmp_path):
    class Miscounting(LMObjective):
        def counts(self, batch):
            return {"lm": super().counts(batch)["lm"] + 1}

    with pytest.raises(LmforgeError, match="must agree"):
        Trainer(tiny_lm(), Miscounting(), ToyData(n=8), train_config(max_steps=1),
                RunOutput(tmp_path, progress=False)).fit()


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="tensorboard is installed")
def test_tensorboard_without_the_package_is_a_clear_error(tmp_path):
    with pytest.raises(LmforgeError, match="pip install tensorboard"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), train_config(tensorboard=True),
                RunOutput(tmp_path, progress=False))


# ---------------------------------------------------------------------------------------------- it learns
def test_overfits_one_batch(tmp_path):
    model = tiny_decoder(d_model=32, n_heads=2, d_ff=64, dropout=0.0, attention_dropout=0.0)
    config = train_config(max_steps=100, batch_size=4, micro_batch_size=4, lr=1e-2, schedule="constant",
                          warmup_steps=10, weight_decay=0.0, log_every=10)
    result = Trainer(model, LMObjective(), ToyData(n=4, seed=2, same_batch=True), config,
                     RunOutput(tmp_path, progress=False)).fit()
    first = read_jsonl(tmp_path / "metrics.jsonl")[0]
    # logged losses are means over 10 steps: steps 1-10 start from ln 99 = 4.6, steps 91-100 memorised the batch
    assert first["loss"] > 3.0 and result["loss"] < 0.05 and result["lm_accuracy"] == 1.0


def test_bf16_autocast_trains(tmp_path):
    model = tiny_lm()
    result = Trainer(model, LMObjective(), ToyData(n=8), train_config(max_steps=2, precision="bf16"),
                     RunOutput(tmp_path, progress=False)).fit()
    assert math.isfinite(result["loss"]) and all(p.dtype == torch.float32 for p in model.parameters())


# ---------------------------------------------------------------------------------------------- a BERT-style job
class MaskedLMAndNSP:
    """The contract for two terms over a TaskModel(Encoder, pretraining head): MLM over the masked positions only
    (a (B, T) bool mask, so the vocabulary projection runs on N rows) and NSP over sequences."""

    def __call__(self, model, batch):
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                    masked_positions=batch["mlm_mask"])
        mlm_logits, nsp_logits = out.mlm_logits, out.nsp_logits  # (N, V), (B, 2)
        mlm = torch.nn.functional.cross_entropy(mlm_logits.float(), batch["mlm_labels"], reduction="sum")
        nsp = torch.nn.functional.cross_entropy(nsp_logits.float(), batch["nsp_labels"], reduction="sum")
        correct = (mlm_logits.argmax(-1) == batch["mlm_labels"]).sum()
        return ObjectiveOutput({"mlm": (mlm, mlm_logits.shape[0]), "nsp": (nsp, nsp_logits.shape[0])},
                               {"mlm_accuracy": (correct, mlm_logits.shape[0])})

    def counts(self, batch):
        return {"mlm": int(batch["mlm_mask"].sum()), "nsp": batch["input_ids"].shape[0]}


class BertBatches:
    def __init__(self, n: int = 8, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, 99, (n, 7), generator=g)
        self.mask = torch.rand(n, 7, generator=g) < 0.3
        self.mask[:, 1] = True  # at least one prediction per sequence
        self.nsp = torch.randint(0, 2, (n,), generator=g)
        self.pos = 0

    def batches(self, micro_batch_size):
        while self.pos + micro_batch_size <= len(self.ids):
            s = slice(self.pos, self.pos + micro_batch_size)
            self.pos += micro_batch_size
            ids = self.ids[s].clone()
            ids[self.mask[s]] = 4  # [MASK]
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                   "mlm_mask": self.mask[s], "mlm_labels": self.ids[s][self.mask[s]], "nsp_labels": self.nsp[s]}
        self.pos = 0

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def test_bert_task_model_trains_and_its_folder_loads(tmp_path):
    from lmforge.heads import TaskModel, build_head
    from lmforge.models.encoder import Encoder

    config = ModelConfig(arch="encoder", vocab_size=99, d_model=12, n_heads=2, n_layers=1, d_ff=37, max_seq_len=16)
    torch.manual_seed(0)
    backbone = Encoder(config)
    model = TaskModel(backbone, build_head({"type": "pretraining"}, config, backbone))
    result = Trainer(model, MaskedLMAndNSP(), BertBatches(), train_config(max_steps=3, eval_every=3),
                     RunOutput(tmp_path, progress=False), eval_data=BertBatches(n=4, seed=1)).fit()
    assert {"loss_mlm", "loss_nsp", "mlm_accuracy", "eval_loss_mlm", "eval_ppl_mlm", "eval_loss_nsp"} <= set(result)
    assert result["loss"] == pytest.approx(result["loss_mlm"] + result["loss_nsp"])
    loaded = load_pretrained(tmp_path)
    assert loaded.head == {"type": "pretraining"}
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name


class EndlessToyData(ToyData):
    """Pretraining-style data: one endless iterator that keeps its own epoch (the Trainer never sees it end)."""

    def batches(self, micro_batch_size: int):
        while True:
            yield from super().batches(micro_batch_size)


def test_logged_epoch_follows_endless_data(tmp_path):
    data = EndlessToyData(n=8)
    Trainer(tiny_lm(), LMObjective(), data, train_config(max_steps=6, batch_size=4, log_every=1),
            RunOutput(tmp_path, progress=False)).fit()
    epochs = [r["epoch"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r and "step" in r]
    assert epochs[0] == 0 and epochs[-1] >= 2  # 8 examples, 4 per step: a new epoch every 2 steps
    assert epochs == sorted(epochs)
