"""LAMB (You et al. 2020, Algorithm 2): the update against a hand-written formula, its state, its groups in
``build_optimizer``, the config option, and training through the Trainer and the command line."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from lmforge import choices
from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer, build_optimizer, decay_parameter_names
from lmforge.training.optim import OPTIMIZER_CLASSES, Lamb
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, tiny_lm, train_config, without_timing

B1, B2, EPS = 0.9, 0.999, 1e-6


def reference(w, grads, lr, weight_decay=0.0, adapt=True, bias_correction=True):
    """The weights after one LAMB update per gradient in ``grads``, in float64 numpy."""
    w, m, v = np.array(w, dtype=np.float64), np.zeros_like(w, dtype=np.float64), np.zeros_like(w, dtype=np.float64)
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, dtype=np.float64)
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        m_hat, v_hat = (m / (1 - B1 ** t), v / (1 - B2 ** t)) if bias_correction else (m, v)
        u = m_hat / (np.sqrt(v_hat) + EPS) + weight_decay * w
        w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
        r = w_norm / u_norm if adapt and w_norm > 0 and u_norm > 0 else 1.0
        w = w - lr * r * u
    return w


def run_lamb(w, grads, lr, weight_decay=0.0, adapt=True, bias_correction=True):
    p = torch.nn.Parameter(torch.tensor(w, dtype=torch.float64))
    optimizer = Lamb([p], lr=lr, betas=(B1, B2), eps=EPS, weight_decay=weight_decay, adapt=adapt,
                     bias_correction=bias_correction)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
    return p.detach().numpy()


W = [[0.5, -1.0, 2.0], [0.25, 0.0, -0.75]]
G1 = [[0.1, 0.2, -0.3], [1.0, -0.5, 0.05]]
G2 = [[-0.2, 0.4, 0.1], [0.3, 0.3, -1.0]]


@pytest.mark.parametrize("weight_decay", [0.0, 0.01, 0.5])
@pytest.mark.parametrize("adapt", [True, False])
@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("grads", [[G1], [G1, G2]], ids=["one step", "two steps"])
def test_update_equals_the_formula(grads, weight_decay, adapt, bias_correction):
    got = run_lamb(W, grads, 0.1, weight_decay, adapt, bias_correction)
    np.testing.assert_allclose(got, reference(W, grads, 0.1, weight_decay, adapt, bias_correction), rtol=1e-12)


def test_first_step_moves_each_adapted_tensor_by_lr_times_its_norm():
    # without weight decay the update direction is m_hat / (sqrt(v_hat) + eps) = sign(g) (up to eps); scaled by
    # ||w|| / ||u||, the step has length lr * ||w||
    got = run_lamb(W, [G1], 0.1)
    assert np.linalg.norm(got - np.array(W)) == pytest.approx(0.1 * np.linalg.norm(W), rel=1e-9)
    unadapted = run_lamb(W, [G1], 0.1, adapt=False)  # Adam's first step: lr * sign(g) per element
    np.testing.assert_allclose(unadapted - np.array(W), -0.1 * np.sign(G1), rtol=1e-4)


def test_zero_norms_give_ratio_one():
    zeros = [[0.0, 0.0], [0.0, 0.0]]
    g = [[1.0, -2.0], [0.5, 0.0]]
    # ||w|| = 0 (a zero-initialised matrix): a plain Adam step instead of no step
    np.testing.assert_allclose(run_lamb(zeros, [g], 0.1), reference(zeros, [g], 0.1, adapt=False), rtol=1e-12)
    assert np.abs(run_lamb(zeros, [g], 0.1)).max() > 0
    # ||u|| = 0 (zero gradient, no decay): nothing moves and nothing is NaN
    w = [[1.0, 2.0], [3.0, 4.0]]
    np.testing.assert_array_equal(run_lamb(w, [zeros], 0.1), w)


def test_parameters_without_grad_are_untouched_and_sparse_grads_are_refused():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    optimizer = Lamb([a, b], lr=0.1, weight_decay=0.5)
    a.grad = torch.ones(3)
    optimizer.step()
    assert torch.equal(b.detach(), torch.ones(3)) and b not in optimizer.state
    assert optimizer.state[a]["step"] == 1 and not torch.equal(a.detach(), torch.ones(3))
    embedding = torch.nn.Embedding(5, 2, sparse=True)
    optimizer = Lamb(embedding.parameters(), lr=0.1)
    embedding(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()


@pytest.mark.parametrize(("options", "message"), [({"lr": -1.0}, "learning rate"), ({"eps": 0.0}, "eps"),
                                                  ({"betas": (0.9, 1.0)}, "betas"), ({"weight_decay": -0.1},
                                                                                     "weight_decay")])
def test_bad_constructor_options(options, message):
    with pytest.raises(ValueError, match=message):
        Lamb([torch.nn.Parameter(torch.ones(2))], **options)


def _step(model, optimizer, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 99, (4, 7), generator=generator)
    optimizer.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).mean().backward()
    optimizer.step()


def test_state_dict_round_trip_continues_identically():
    model = tiny_lm()
    optimizer = build_optimizer(model, train_config(optimizer="lamb", weight_decay=0.1, lr=0.01))
    for seed in range(3):
        _step(model, optimizer, seed)
    saved_model, saved_state = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    assert all(isinstance(s["step"], int) and s["step"] == 3 for s in saved_state["state"].values())
    for seed in range(3, 6):
        _step(model, optimizer, seed)

    other = tiny_lm(seed=7)
    other.load_state_dict(saved_model)
    restored = build_optimizer(other, train_config(optimizer="lamb", weight_decay=0.1, lr=0.01))
    restored.load_state_dict(saved_state)
    for seed in range(3, 6):
        _step(other, restored, seed)
    for (name, p), q in zip(model.named_parameters(), other.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_an_adamw_state_is_refused():
    model = tiny_lm()
    adamw = build_optimizer(model, train_config())
    _step(model, adamw, 0)
    lamb = build_optimizer(model, train_config(optimizer="lamb"))
    with pytest.raises(LmforgeError, match="not LAMB's"):
        lamb.load_state_dict(adamw.state_dict())


def test_build_optimizer_gives_lamb_with_adamw_groups():
    model = tiny_decoder()
    scales = {"final_norm.weight": 2.0, "layers.0.ffn.fc1.weight": 0.5}
    adamw = build_optimizer(model, train_config(weight_decay=0.1, lr=0.01), scales)
    lamb = build_optimizer(model, train_config(optimizer="lamb", weight_decay=0.1, lr=0.01, beta1=0.8, beta2=0.99,
                                               eps=1e-8), scales)
    assert isinstance(adamw, torch.optim.AdamW) and isinstance(lamb, Lamb)
    assert len(lamb.param_groups) == len(adamw.param_groups) == 4
    for a, b in zip(adamw.param_groups, lamb.param_groups, strict=True):
        assert [id(p) for p in a["params"]] == [id(p) for p in b["params"]]
        assert a["lr"] == b["lr"] and a["weight_decay"] == b["weight_decay"]
        # the trust ratio follows the decay grouping: biases and norms are excluded from both
        assert b["adapt"] is (b["weight_decay"] > 0) and b["bias_correction"] is True
        assert b["betas"] == (0.8, 0.99) and b["eps"] == 1e-8
    params = dict(model.named_parameters())
    decay, no_decay = decay_parameter_names(model)
    adapted = {id(p) for g in lamb.param_groups if g["adapt"] for p in g["params"]}
    assert adapted == {id(params[n]) for n in decay} and not adapted & {id(params[n]) for n in no_decay}
    assert lamb.param_groups[0]["lr"] == 0.01 and lamb.param_groups[0]["adapt"]  # what the Trainer logs


def test_every_optimizer_name_is_built():
    assert list(OPTIMIZER_CLASSES) == list(choices.OPTIMIZERS)
    for name in choices.OPTIMIZERS:
        assert type(build_optimizer(tiny_lm(), train_config(optimizer=name))) is OPTIMIZER_CLASSES[name]


def test_a_bad_optimizer_name_lists_the_choices():
    with pytest.raises(LmforgeError, match=r"optimizer='adam' is not one of adamw, lamb"):
        TrainConfig(optimizer="adam")


def test_lamb_fits_a_linear_regression():
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1) + 0.5
    model = torch.nn.Linear(8, 1)
    # the weight norm grows by at most lr per step (a trust ratio of 1 in relative terms): from about 0.6 to about 3
    optimizer = build_optimizer(model, train_config(optimizer="lamb", lr=0.1, weight_decay=0.0))
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.05 * losses[0]


def _fit(out, resume="never", seed=0):
    # lr 0.1: each matrix moves by a tenth of its norm per update (the init is small: std 0.02)
    config = train_config(optimizer="lamb", max_steps=8, save_every=4, weight_decay=0.01, lr=0.1)
    return Trainer(tiny_decoder(seed), LMObjective(), ToyData(n=16, seed=3), config,
                   RunOutput(out, resume=resume, progress=False)).fit()


def test_trainer_trains_and_resumes_with_lamb(tmp_path):
    full = tmp_path / "full"
    _fit(full)
    records = read_jsonl(full / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 9)) and records[-1]["loss"] < records[0]["loss"] - 0.1
    # the checkpoint holds LAMB's state: a resume from step 4 continues identically
    _fit(tmp_path / "resumed", resume=full / "checkpoints" / "step-4", seed=123)
    assert without_timing(read_jsonl(tmp_path / "resumed" / "metrics.jsonl")) == without_timing(records[4:])


def test_pretrain_cli_with_lamb(tmp_path, bbc_dir, capsys):
    from lmforge.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted((bbc_dir / "tech").glob("*.txt"))[:6]:
        (corpus / path.name).write_bytes(path.read_bytes())
    assert main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "tok"),
                 "--algorithm", "bpe-count"]) == 0
    assert main(["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--input", str(corpus), "--out",
                 str(tmp_path / "data"), "--workers", "1"]) == 0
    out = tmp_path / "run"
    code = main(["pretrain", "--preset", "bert-tiny", "--objective", "mlm", "--data", str(tmp_path / "data"),
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--seq-len", "32",
                 "--train.optimizer=lamb", "--model.n_layers=1", "--model.d_model=16", "--model.n_heads=2",
                 "--model.d_ff=32", "--model.max_seq_len=32", "--train.log_every=1", "--train.eval_batches=1"])
    assert code == 0, capsys.readouterr().err

    assert json.loads((out / "run_config.json").read_text())["train"]["optimizer"] == "lamb"
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] == [1, 2]
    assert main(["pretrain", "--preset", "bert-tiny", "--data", str(tmp_path / "data"), "--out",
                 str(tmp_path / "bad"), "--train.optimizer=sgd"]) != 0
    assert "optimizer='sgd' is not one of adamw, lamb" in capsys.readouterr().err
