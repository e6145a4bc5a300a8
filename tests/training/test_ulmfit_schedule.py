"""ULMFiT's fine-tuning schedule (Howard & Ruder 2018, section 3.2): the slanted triangular learning rate (eq. 3),
discriminative learning rates (lr_{l-1} = lr_l / 2.6) and gradual unfreezing, through the Trainer, checkpoints and
resume."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from lmforge.config import ModelConfig, TrainConfig
from lmforge.errors import LmforgeError
from lmforge.heads import TaskModel, build_head
from lmforge.heads.classification import ConcatPoolingClassifierHead
from lmforge.models.awd_lstm import AWDLSTM
from lmforge.objectives.base import ObjectiveOutput
from lmforge.training import RunOutput
from lmforge.training.freeze import lr_scales
from lmforge.training.optim import build_optimizer, lr_multiplier, slanted_triangular
from lmforge.training.trainer import Trainer
from lmforge.training.unfreeze import GradualUnfreezing, layer_groups

V = 50


def stlr(t: int, T: int, cut_frac: float = 0.1, ratio: float = 32.0) -> float:
    """Eq. 3 of the paper, written out (p floored at 0: when T * cut_frac is not an integer, the decay reaches 0 a few
    steps before T, and the paper's formula would go below lr / ratio there)."""
    cut = math.floor(T * cut_frac)
    p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
    return (1 + max(p, 0.0) * (ratio - 1)) / ratio


@pytest.mark.parametrize("T", [100, 1000, 57])
def test_slanted_triangular_follows_equation_3(T):
    config = TrainConfig(schedule="slanted_triangular", max_steps=T, lr=0.01)
    cut = math.floor(T * 0.1)
    for t in (1, cut // 2, cut - 1, cut, cut + 1, T // 2, T - 1, T):
        assert lr_multiplier(t, config) == pytest.approx(stlr(t, T)), t
    assert lr_multiplier(cut, config) == pytest.approx(1.0)  # the peak at update cut
    assert lr_multiplier(T, config) == pytest.approx(1 / 32, abs=1e-3)  # back down to lr / ratio
    assert lr_multiplier(T + 50, config) == pytest.approx(1 / 32)  # floored past the end
    assert slanted_triangular(5, 100, cut_frac=0.2, ratio=10) == pytest.approx(stlr(5, 100, 0.2, 10))
    with pytest.raises(LmforgeError, match="stlr_ratio"):
        TrainConfig(schedule="slanted_triangular", stlr_ratio=0.5)


def classifier(n_layers: int = 3, seed: int = 0) -> TaskModel:
    torch.manual_seed(seed)
    config = ModelConfig(arch="awd_lstm", vocab_size=V, d_model=8, d_hidden=11, n_layers=n_layers, max_seq_len=4096,
                         bptt=4, embed_p=0.0, input_p=0.0, hidden_p=0.0, weight_p=0.0,
                         output_p=0.0)
    backbone = AWDLSTM(config)
    head = build_head({"type": "sequence_classification", "labels": ["a", "b"], "dropout": 0.0}, config, backbone)
    assert isinstance(head, ConcatPoolingClassifierHead)
    return TaskModel(backbone, head)


def test_discriminative_rates_divide_by_2_6_per_group():
    model = classifier(n_layers=3)
    scales = lr_scales(model, lr=1e-3, layer_decay=1 / 2.6)
    groups = layer_groups(model)
    assert [g[0].split(".")[1] if g[0].startswith("backbone.") else "head" for g in groups] == \
        ["embeddings", "layers", "layers", "layers", "lm_bias"]
    per_group = [scales[g[0]] for g in groups]
    assert per_group[-1] == 1.0  # the top group (head, LM bias) trains at the run's lr
    for lower, upper in zip(per_group, per_group[1:], strict=False):
        assert lower == pytest.approx(upper / 2.6)
    assert all(scales[n] == per_group[i] for i, g in enumerate(groups) for n in g)  # one rate per group
    optimizer = build_optimizer(model, TrainConfig(lr=1e-3, max_steps=10), scales)
    rates = sorted({round(g["lr"], 12) for g in optimizer.param_groups})
    assert rates == sorted({round(1e-3 / 2.6 ** k, 12) for k in range(5)})


def test_gradual_unfreezing_order():
    model = classifier(n_layers=3)
    unfreezing = GradualUnfreezing(model, steps_per_stage=10)
    groups = unfreezing.groups
    assert len(groups) == 5  # embeddings, 3 layers, head
    params = dict(model.named_parameters())

    def trainable(step: int) -> list[bool]:
        unfreezing.before_step(step)
        return [all(params[n].requires_grad for n in g) for g in groups]

    assert trainable(0) == trainable(9) == [False, False, False, False, True]  # epoch 1: the last group only
    assert trainable(10) == [False, False, False, True, True]  # epoch 2: + the last LSTM layer
    assert trainable(20) == [False, False, True, True, True]  # epoch 3
    assert trainable(40) == trainable(500) == [True] * 5  # then everything
    assert trainable(0) == [False, False, False, False, True]  # a pure function of the step (resume)
    for g in groups:  # no group is ever half-frozen
        assert len({params[n].requires_grad for n in g}) == 1


class Documents:
    """Endless batches of random token documents with labels; position = batches handed out."""

    def __init__(self, seed: int = 0) -> None:
        self.seed, self.position = seed, 0

    def batches(self, micro_batch_size: int):
        while True:
            g = torch.Generator().manual_seed(self.seed * 1000 + self.position)
            self.position += 1
            ids = torch.randint(5, V, (micro_batch_size, 9), generator=g)
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                   "labels": (ids[:, 0] % 2).long()}

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class Classify:
    def counts(self, batch):
        return {"cls": int(batch["labels"].shape[0])}

    def __call__(self, model, batch):
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return ObjectiveOutput({"cls": (out.loss_sum, out.loss_count)}, {})


def trainer(model, out, max_steps: int, resume: str = "never", kind: str = "finetune (task sequence)") -> Trainer:
    config = TrainConfig(max_steps=max_steps, batch_size=4, lr=1e-2, save_every=2, log_every=1,
                         schedule="slanted_triangular", weight_decay=0.0)
    callbacks = {"unfreezing": GradualUnfreezing(model, steps_per_stage=2)}
    return Trainer(model, Classify(), Documents(), config, RunOutput(out, progress=False, resume=resume, run_kind=kind),
                   callbacks=callbacks, lr_scales=lr_scales(model, lr=1e-2, layer_decay=1 / 2.6))


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def moved(before, model, group) -> bool:
    params = dict(model.named_parameters())
    return any(not torch.equal(before[n], params[n]) for n in group)


def test_gradual_unfreezing_through_the_trainer_and_resume(tmp_path):
    model = classifier(n_layers=2)
    groups = layer_groups(model)  # embeddings, layers.0, layers.1, head (+ lm_bias)
    start = snapshot(model)
    trainer(model, tmp_path / "run", max_steps=2).fit()  # stage 1: two updates
    assert moved(start, model, groups[-1])
    assert not any(moved(start, model, g) for g in groups[:-1])
    # resume the same folder to step 4 (stage 2): the top LSTM layer starts to move, the rest stays
    resumed = classifier(n_layers=2)
    after_stage_1 = snapshot(model)
    t = trainer(resumed, tmp_path / "run", max_steps=4, resume="auto")
    for n, p in resumed.named_parameters():
        assert torch.equal(p, after_stage_1[n])  # the checkpoint's weights
    t.fit()
    assert moved(after_stage_1, resumed, groups[-1]) and moved(after_stage_1, resumed, groups[-2])
    assert not moved(after_stage_1, resumed, groups[0]) and not moved(after_stage_1, resumed, groups[1])
    state = torch.load(tmp_path / "run" / "checkpoints" / "step-4" / "trainer_state.pt", weights_only=False)
    assert state["components"]["unfreezing"] == {"steps_per_stage": 2, "groups": groups}
    assert state["run_kind"] == "finetune (task sequence)"


def test_resuming_from_another_kind_of_run_is_refused(tmp_path):
    trainer(classifier(), tmp_path / "run", max_steps=2).fit()
    with pytest.raises(LmforgeError, match=r"another kind of run \(finetune \(task sequence\)\), this run is "
                                           r"pretrain.*own --out folder"):
        trainer(classifier(), tmp_path / "run", max_steps=4, resume="auto", kind="pretrain (objective awd_lm)")
