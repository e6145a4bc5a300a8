"""NT-ASGD (Merity et al. 2018, section 3, Algorithm 1): the trigger by its rule, SGD steps and the average of the
iterates by formula, evaluation and the final model on the average, and exact resumption."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer, load_trainer_state
from lmforge.training.ntasgd import NTASGD, averaged_weights, evaluating
from lmforge.training.optim import build_optimizer
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, train_config, without_timing


def test_the_trigger_fires_on_the_first_loss_worse_than_the_best_before_the_last_n():
    optimizer = NTASGD(nn.Linear(2, 2).parameters(), lr=0.1, nonmono=5)
    losses = [5.0, 4.0, 3.0, 2.9, 2.95, 2.92, 2.91, 2.93, 2.89, 2.96, 9.0]
    fired = [optimizer.observe(v, step=10 * (i + 1)) for i, v in enumerate(losses)]
    # evaluation t (0-based) fires when t > 5 and v > min(losses[:t - 5]):
    # t = 4 (2.95 > 2.9) is too early to count; t = 6: 2.91 > 5.0? t = 7: 2.93 > 4.0? (worse than the evaluation just
    # before it, yet not a trigger: the rule is non-monotone); t = 8: 2.89 > 3.0?; t = 9: 2.96 > min(5, 4, 3, 2.9)
    assert fired == [False] * 9 + [True, False]
    assert optimizer.trigger_step == 100 and optimizer.triggered
    assert optimizer.logs == losses[:10]  # nothing is logged after the trigger
    with pytest.raises(LmforgeError, match="nonmono=0 must be >= 1"):
        NTASGD(nn.Linear(2, 2).parameters(), lr=0.1, nonmono=0)


def test_sgd_steps_then_the_average_of_the_iterates_since_the_trigger():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    lr, wd = 0.1, 0.01
    optimizer = NTASGD(model.parameters(), lr=lr, weight_decay=wd, nonmono=1)
    x = torch.randn(4, 3)

    def step() -> list[torch.Tensor]:
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        for p, w, g in zip(model.parameters(), before, grads, strict=True):  # plain SGD with L2: w - lr (g + wd w)
            torch.testing.assert_close(p.detach(), w - lr * (g + wd * w))
        return [p.detach().clone() for p in model.parameters()]

    first = step()
    with averaged_weights(optimizer):  # before the trigger: nothing to average, the model is untouched
        assert all(torch.equal(p, w) for p, w in zip(model.parameters(), first, strict=True))
    assert [optimizer.observe(v, step=1) for v in (1.0, 0.5, 2.0)] == [False, False, True]
    iterates = [step() for _ in range(3)]  # w_1, w_2, w_3: the updates after the trigger
    with averaged_weights(optimizer):
        for i, p in enumerate(model.parameters()):
            torch.testing.assert_close(p.detach(), sum(w[i] for w in iterates) / 3)
    for p, w in zip(model.parameters(), iterates[-1], strict=True):  # training goes on from the iterate
        assert torch.equal(p.detach(), w)
    # the state (average, count, trigger, logs) survives state_dict -> load_state_dict into a fresh optimizer
    again = NTASGD(model.parameters(), lr=lr, weight_decay=wd, nonmono=1)
    again.load_state_dict(optimizer.state_dict())
    assert (again.averaged, again.trigger_step, again.logs) == (3, 1, [1.0, 0.5, 2.0])
    with averaged_weights(again):
        for i, p in enumerate(model.parameters()):
            torch.testing.assert_close(p.detach(), sum(w[i] for w in iterates) / 3)
    with pytest.raises(LmforgeError, match="not NT-ASGD's"):
        again.load_state_dict(torch.optim.SGD(model.parameters(), lr=lr).state_dict())


def test_the_evaluation_hook_needs_a_held_out_loss_and_other_optimizers_are_untouched():
    model = nn.Linear(2, 2)
    with evaluating(torch.optim.AdamW(model.parameters()), {"step": 1}):  # not NT-ASGD: nothing happens
        pass
    with pytest.raises(LmforgeError, match=r"needs held-out|eval_loss"):
        with evaluating(NTASGD(model.parameters(), lr=0.1), {"step": 1, "accuracy": 0.5}):
            pass
    built = build_optimizer(model, TrainConfig(optimizer="nt_asgd", lr=30.0, weight_decay=1.2e-6, nonmono=3))
    assert isinstance(built, NTASGD) and built.nonmono == 3 and built.param_groups[0]["lr"] == 30.0
    with pytest.raises(LmforgeError, match="parallel=ddp"):
        build_optimizer(model, TrainConfig(optimizer="nt_asgd", parallel="fsdp"))
    with pytest.raises(LmforgeError, match="nonmono=0 must be >= 1"):
        TrainConfig(optimizer="nt_asgd", nonmono=0)


def _run(out, *, max_steps: int, resume: str = "never") -> dict:
    # a high constant rate on 16 random sequences: the held-out loss soon rises (memorising), which triggers
    config = train_config(optimizer="nt_asgd", lr=3.0, schedule="constant", warmup_steps=0, max_steps=max_steps,
                          eval_every=1, save_every=1, nonmono=1, weight_decay=0.0)
    trainer = Trainer(tiny_decoder(0, dropout=0.0, attention_dropout=0.0), LMObjective(), ToyData(n=16, seed=3),
                      config, RunOutput(out, resume=resume, progress=False),
                      eval_data=ToyData(n=6, seed=4, fixed=True))
    return trainer.fit()


def test_the_trainer_evaluates_and_saves_the_average_and_resumes_exactly(tmp_path):
    full = tmp_path / "full"
    _run(full, max_steps=8)
    state = load_trainer_state(full / "checkpoints" / "step-8")
    trigger = state["components"]["optimizer"]["nt_asgd"]["trigger_step"]
    assert trigger is not None and trigger < 5, state["components"]["optimizer"]["nt_asgd"]
    # the final model is the mean of the iterates w_{trigger+1} ... w_8, which the checkpoints hold
    iterates = [load_file(str(full / "checkpoints" / f"step-{k}" / "model.safetensors")) for k in range(trigger + 1, 9)]
    final = load_file(str(full / "model.safetensors"))
    for name, tensor in final.items():
        torch.testing.assert_close(tensor, sum(w[name] for w in iterates) / len(iterates))
    assert any(not torch.equal(final[name], iterates[-1][name]) for name in final)  # not the last iterate
    # resumed after the trigger: the same records (evaluations of the average included) and the same final model
    part = tmp_path / "part"
    _run(part, max_steps=trigger + 2)
    _run(part, max_steps=8, resume="auto")
    assert without_timing(read_jsonl(part / "metrics.jsonl")) == without_timing(read_jsonl(full / "metrics.jsonl"))
    for name, tensor in load_file(str(part / "model.safetensors")).items():
        assert torch.equal(tensor, final[name]), name
