"""``--compile`` (issue 22, item 6): torch.compile in the Trainer, for inference and on the command line.

Most tests use the ``aot_eager`` / ``eager`` backends (``LMFORGE_COMPILE_BACKEND``): TorchDynamo traces the model and
AOT autograd splits forward and backward exactly as under inductor, without generating C++ (a minute per model on
a small CPU). One test runs the real inductor backend on a tiny model, and skips without a C++ compiler.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer
from lmforge.utils import compiling
from lmforge.utils.compiling import BACKEND_ENV, compile_errors, compile_in_place, compile_module
from tests.training.helpers import LMObjective, ToyData, read_jsonl, tiny_decoder, tiny_lm, train_config, without_timing


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """Every test starts with empty TorchDynamo caches and the aot_eager backend (tests may name another)."""
    import torch._dynamo

    monkeypatch.setenv(BACKEND_ENV, "aot_eager")
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    yield
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.reset()


def _decoder(seed: int) -> torch.nn.Module:
    return tiny_decoder(seed)


def _run(out: Path, *, compile: bool, resume="never", seed: int = 0, **overrides) -> Trainer:
    config = train_config(**{"max_steps": 4, "save_every": 2, "eval_every": 2, "compile": compile, **overrides})
    trainer = Trainer(_decoder(seed), LMObjective(two_terms=True), ToyData(n=16, seed=3), config,
                      RunOutput(out, resume=resume, progress=False), eval_data=ToyData(n=6, seed=4, fixed=True))
    trainer.fit()
    return trainer


def _records(out: Path, after: int = 0) -> list[dict]:
    return without_timing([r for r in read_jsonl(out / "metrics.jsonl") if r["step"] > after])


def _close(a: list[dict], b: list[dict], tol: float = 1e-5) -> None:
    assert [sorted(r) for r in a] == [sorted(r) for r in b]
    for ra, rb in zip(a, b, strict=True):
        for key, value in ra.items():
            if isinstance(value, float):
                assert math.isclose(value, rb[key], rel_tol=tol, abs_tol=tol), (ra["step"], key, value, rb[key])
            else:
                assert value == rb[key], (ra["step"], key)


def _keys(value, prefix: str = "") -> list[str]:
    """Every dict key and string inside a (nested) checkpoint state."""
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in [str(key), *_keys(v)]]
    if isinstance(value, (list, tuple)):
        return [k for v in value for k in _keys(v)]
    return [value] if isinstance(value, str) else []


def test_compiled_training_saves_the_plain_module_and_resumes_across_compile_on_off(tmp_path):
    _run(tmp_path / "eager", compile=False)
    compiled = _run(tmp_path / "compiled", compile=True)
    assert type(compiled.placement.forward).__name__ == "OptimizedModule"  # what the objective calls
    assert compiled.model is compiled.placement.forward._orig_mod  # the optimizer and every save read the plain module
    # same batch, same dropout draws: the same losses, metrics and eval results with and without compile
    _close(_records(tmp_path / "eager"), _records(tmp_path / "compiled"))
    # no saved key names the wrapper: checkpoints, the final model, the trainer state
    for folder in (tmp_path / "compiled", tmp_path / "compiled" / "checkpoints" / "step-2",
                   tmp_path / "compiled" / "checkpoints" / "step-4"):
        keys = list(load_file(str(folder / "model.safetensors")))
        assert keys and not [k for k in keys if "_orig_mod" in k], folder
        assert sorted(keys) == sorted(load_file(str(tmp_path / "eager" / "model.safetensors")))
    state = torch.load(tmp_path / "compiled" / "checkpoints" / "step-2" / "trainer_state.pt", weights_only=True)
    assert not [k for k in _keys(state) if "_orig_mod" in k]
    assert state["train_config"]["compile"] is True
    # resume a run written without compile, with it, and the other way round: the very continuation
    _run(tmp_path / "on", compile=True, seed=7, resume=tmp_path / "eager" / "checkpoints" / "step-2")
    _close(_records(tmp_path / "on"), _records(tmp_path / "eager", after=2))
    _run(tmp_path / "off", compile=False, seed=7, resume=tmp_path / "compiled" / "checkpoints" / "step-2")
    _close(_records(tmp_path / "off"), _records(tmp_path / "compiled", after=2))
    for name, tensor in load_file(str(tmp_path / "eager" / "model.safetensors")).items():
        torch.testing.assert_close(load_file(str(tmp_path / "on" / "model.safetensors"))[name], tensor)


def test_varying_lengths_compile_a_bounded_number_of_times():
    """Automatic dynamic shapes: after the second shape the graphs are symbolic in the length and the batch size,
    so further lengths reuse them instead of compiling once per batch."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    model = tiny_decoder(0, max_seq_len=32)
    compiled = compile_module(model, "cpu", backend=counter)
    objective = LMObjective()
    frames = []
    for length, batch in ((5, 4), (9, 4), (12, 3), (17, 4), (23, 2), (30, 4)):
        ids = torch.randint(1, 99, (batch, length))
        batch_data = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        objective(compiled, batch_data).losses["lm"][0].backward()
        frames.append(counter.frame_count)
    assert frames[-1] == frames[2], frames  # nothing compiled after the first three shapes
    assert compiling.recompile_limit_hits() == 0


def test_hitting_the_recompile_limit_is_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(compiling, "RECOMPILE_LIMIT", 1)
    model = compile_module(torch.nn.Linear(4, 4), "cpu", backend="eager", dynamic=False)
    with caplog.at_level(logging.WARNING, logger="lmforge"):
        for n in (1, 2, 3):
            model(torch.randn(n, 4))
    warnings = [r.getMessage() for r in caplog.records if r.name == "lmforge"]
    assert any("--compile:" in w and "recompiled 1 times (the cache limit)" in w for w in warnings), warnings
    assert compiling.recompile_limit_hits() >= 1


def test_no_cxx_compiler_is_an_error_naming_the_option(monkeypatch, tmp_path):
    monkeypatch.delenv(BACKEND_ENV)  # inductor
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    with pytest.raises(LmforgeError, match=r"--compile needs a C\+\+ compiler .* run without --compile"):
        Trainer(tiny_lm(), LMObjective(), ToyData(n=8), train_config(compile=True),
                RunOutput(tmp_path / "run", progress=False))
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_backend_failure_at_the_first_step_is_an_lmforge_error(monkeypatch, tmp_path):
    from torch._dynamo import register_backend

    @register_backend(name="lmforge_test_broken")
    def broken(gm, example_inputs):  # what a missing Python.h or a failing C++ compiler looks like
        raise RuntimeError("cc1plus: fatal error: Python.h: No such file or directory")

    monkeypatch.setenv(BACKEND_ENV, "lmforge_test_broken")
    trainer = Trainer(tiny_lm(), LMObjective(), ToyData(n=8), train_config(compile=True),
                      RunOutput(tmp_path, progress=False))
    with pytest.raises(LmforgeError, match=r"--compile failed: .*Python\.h.*; run without --compile") as info:
        trainer.fit()
    assert "\n" not in str(info.value)
    with pytest.raises(ZeroDivisionError), compile_errors():  # the model's own errors pass unchanged
        raise ZeroDivisionError


def test_inductor_step_matches_eager():
    """The real backend (C++ code generation) on a tiny model: the same loss and gradients as eager, dropout
    included (eager's random stream under --compile)."""
    if compiling.find_cxx() is None:
        pytest.skip(f"no C++ compiler ({', '.join(compiling.cxx_candidates())}) for torch.compile's inductor backend")
    objective = LMObjective()
    batch = next(ToyData(n=8, seed=3).batches(4))
    results = []
    for compile in (False, True):
        model = tiny_lm(0, dropout=0.1).train()
        called = compile_module(model, "cpu", backend="inductor") if compile else model
        torch.manual_seed(5)
        loss = objective(called, batch).losses["lm"][0]
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        assert sorted(dict(model.named_parameters())) == sorted(results[0][1])
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_inductor_inference_folds_the_weights_in_and_matches_eager():
    """``compile_in_place`` with the real backend: padded batches of new lengths (one graph, unpadding inside it,
    the weights frozen into it) give eager's states at the real tokens; a forward with gradients on still trains
    (no freezing there) and changes nothing for the inference graph."""
    if compiling.find_cxx() is None:
        pytest.skip(f"no C++ compiler ({', '.join(compiling.cxx_candidates())}) for torch.compile's inductor backend")
    from lmforge.config import model_config_from_preset
    from lmforge.models.encoder import Encoder

    cfg = model_config_from_preset("bert-tiny", vocab_size=60)
    torch.manual_seed(0)
    eager = Encoder(cfg).eval()
    compiled = Encoder(cfg).eval()
    compiled.load_state_dict(eager.state_dict())
    assert compile_in_place(compiled, backend="inductor") is compiled
    g = torch.Generator().manual_seed(1)
    for B, T in ((3, 9), (4, 13), (2, 6), (3, 16)):
        ids = torch.randint(5, 60, (B, T), generator=g)
        mask = torch.ones_like(ids)
        mask[0, T // 2:] = 0
        with torch.no_grad():
            want = eager(ids, attention_mask=mask).last_hidden_state
            got = compiled(ids, attention_mask=mask).last_hidden_state
        real = mask.bool()
        torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4, msg=f"B={B}, T={T}")
    torch.manual_seed(1)  # a second model of the same class (an ensemble's members): its own weights, not the first's
    other_eager = Encoder(cfg).eval()
    other = compile_in_place(Encoder(cfg).eval(), backend="inductor")
    other.load_state_dict(other_eager.state_dict())
    with torch.no_grad():
        for model, reference in ((other, other_eager), (compiled, eager)):
            got = model(ids, attention_mask=mask).last_hidden_state
            want = reference(ids, attention_mask=mask).last_hidden_state
            torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4)
    compiled(ids, attention_mask=mask).last_hidden_state.sum().backward()  # gradients on: not frozen
    assert all(p.grad is not None for p in compiled.parameters() if p.requires_grad and p.dim() > 1)


def test_inference_compiles_in_place(tiny_encoder_dir, tmp_path):
    from lmforge.cli import main
    from lmforge.persistence import load_pretrained

    model = load_pretrained(tiny_encoder_dir, with_head=False).model.eval()
    keys = list(model.state_dict())
    ids = torch.randint(5, 40, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).last_hidden_state
        same = compile_in_place(model, backend="eager")
        got = model(ids, attention_mask=mask).last_hidden_state
    assert same is model and list(model.state_dict()) == keys  # the same object: class, attributes, keys
    torch.testing.assert_close(got, expected)
    text = tmp_path / "lines.txt"
    text.write_text("alice went to paris\nbob saw the capital of rome today\ngreat\n", encoding="utf-8")
    for flag in ([], ["--compile"]):
        out = tmp_path / f"embed{len(flag)}.npy"
        assert main(["-q", "embed", "--model", str(tiny_encoder_dir), "--input", str(text), "--out", str(out),
                     "--batch-size", "2", *flag]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "embed1.npy"), np.load(tmp_path / "embed0.npy"), atol=1e-5)


def test_serve_compiles_the_encoder_at_start(tiny_encoder_dir):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app

    answers = []
    for compile in (False, True):
        app = create_app(tiny_encoder_dir, compile=compile)
        assert app.state.model.compiled is compile
        with TestClient(app) as client:
            response = client.post("/embed", json={"texts": ["alice went to paris", "bob"]})
        assert response.status_code == 200, response.text
        answers.append(np.array(response.json()["embeddings"]))
    np.testing.assert_allclose(answers[1], answers[0], atol=1e-5)


@pytest.mark.parametrize("command, base", [
    ("pretrain", ["--input", "d", "--out", "o"]),
    ("distill", ["--teacher", "t", "--input", "d", "--out", "o"]),
    ("finetune", ["--task", "sequence", "--model", "m", "--train", "t.csv", "--out", "o"]),
    ("train-seq2seq", ["--train", "t.tsv", "--out", "o"]),
])
def test_training_commands_map_compile_to_the_train_config(command, base):
    from lmforge.cli import build_parser
    from lmforge.commands import distill, finetune, pretrain, seq2seq

    resolve_run = {"pretrain": pretrain.resolve_run, "distill": distill.resolve_run,
                   "finetune": finetune.resolve_run, "train-seq2seq": seq2seq.resolve_run}[command]
    parser = build_parser()
    assert resolve_run(parser.parse_args([command, *base])).train.compile is False
    assert resolve_run(parser.parse_args([command, *base, "--compile"])).train.compile is True
    args = parser.parse_args([command, *base])
    args.overrides = ["--train.compile=true"]  # as the command line passes a dotted setting
    assert resolve_run(args).train.compile is True
    helps = {a.option_strings[-1]: a.help for a in parser._subparsers._group_actions[0].choices[command]._actions
             if a.option_strings}
    assert "default: off" in helps["--compile"]


def test_predict_and_evaluate_with_compile_give_the_same_answers(finetuned, tmp_path):
    """`predict --compile` and `evaluate --compile` from the command line: the same predictions and metrics as
    without (aot_eager here; the option is what is tested, not inductor's code generation)."""
    import json

    from lmforge.cli import main

    run, _, dev = finetuned("sequence")
    outputs = {}
    for flag in ([], ["--compile"]):
        out = tmp_path / f"predictions{len(flag)}.jsonl"
        assert main(["-q", "predict", "--model", str(run), "--input", str(dev), "--out", str(out), *flag]) == 0
        outputs[len(flag)] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        metrics = tmp_path / f"metrics{len(flag)}.json"
        assert main(["-q", "evaluate", "--model", str(run), "--test", str(dev), "--out", str(metrics), *flag]) == 0
        outputs[f"m{len(flag)}"] = json.loads(metrics.read_text(encoding="utf-8"))
    assert [r["label"] for r in outputs[1]] == [r["label"] for r in outputs[0]] and outputs[0]
    assert outputs["m1"]["accuracy"] == outputs["m0"]["accuracy"]


def test_inductor_compiled_bf16_predictions_match_uncompiled_bf16(finetuned, tmp_path, monkeypatch):
    """``predict --compile --precision bf16`` with the real backend: the frozen graph holds the autocast's bf16
    products and gives the uncompiled bf16 model's probabilities (bf16 rounding apart)."""
    import json

    if compiling.find_cxx() is None:
        pytest.skip(f"no C++ compiler ({', '.join(compiling.cxx_candidates())}) for torch.compile's inductor backend")
    from lmforge.cli import main

    monkeypatch.delenv(BACKEND_ENV)  # inductor
    run, _, dev = finetuned("sequence")
    rows = {}
    for flag in ([], ["--compile"]):
        out = tmp_path / f"p{len(flag)}.jsonl"
        assert main(["-q", "predict", "--model", str(run), "--input", str(dev), "--out", str(out), "--precision",
                     "bf16", *flag]) == 0
        rows[len(flag)] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows[0]) == len(rows[1]) > 0
    for a, b in zip(rows[0], rows[1], strict=True):
        assert b["probabilities"] == pytest.approx(a["probabilities"], abs=0.02)
