"""``--precision`` for inference (``predict``, ``evaluate``, ``embed``, ``serve``, ``lmforge.pipeline``): the model
under bf16 autocast, its outputs back in fp32 (``lmforge.training.precision.autocast_inference``). bf16 is only
fast on a CPU with AVX512_BF16 or AMX, but it computes the same function everywhere (emulated elsewhere), so these
tests hold on any CPU; "auto" is machine-dependent and only its outcome's shape is checked."""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.config import model_config_from_preset
from lmforge.errors import LmforgeError
from lmforge.models.loading import build_backbone
from lmforge.training.precision import autocast_inference, to_fp32


def test_bf16_runs_the_forward_under_autocast_and_returns_fp32():
    torch.manual_seed(0)
    fp32 = build_backbone(model_config_from_preset("bert-tiny", vocab_size=60)).eval()
    bf16 = build_backbone(model_config_from_preset("bert-tiny", vocab_size=60)).eval()
    bf16.load_state_dict(fp32.state_dict())
    assert autocast_inference(bf16, "bf16").precision == "bf16"
    assert autocast_inference(fp32, "fp32").precision == "fp32" and "forward" not in vars(fp32)
    ids = torch.randint(5, 60, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    with torch.no_grad():
        want, got = fp32(ids, attention_mask=mask), bf16(ids, attention_mask=mask)
    assert got.last_hidden_state.dtype == got.pooled_output.dtype == torch.float32
    real = mask.bool()
    diff = (got.last_hidden_state - want.last_hidden_state)[real].abs().max().item()
    assert 0 < diff < 0.1  # bf16 products: close, not equal


def test_to_fp32_reaches_into_the_output_containers():
    class Out(NamedTuple):
        logits: torch.Tensor
        ids: torch.Tensor

    @dataclasses.dataclass
    class Box:
        states: torch.Tensor
        extra: dict

    half = torch.ones(2, dtype=torch.bfloat16)
    out = to_fp32(Out(half, torch.arange(2)))
    assert isinstance(out, Out) and out.logits.dtype == torch.float32 and out.ids.dtype == torch.int64
    box = to_fp32(Box(half, {"a": [half, None]}))
    assert box.states.dtype == torch.float32 and box.extra["a"][0].dtype == torch.float32


def test_predict_evaluate_and_embed_with_bf16(finetuned, tiny_encoder_dir, tmp_path):
    run, _, dev = finetuned("sequence")
    rows, metrics = {}, {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.jsonl"
        assert main(["-q", "predict", "--model", str(run), "--input", str(dev), "--out", str(out), "--precision",
                     precision]) == 0
        rows[precision] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        scores = tmp_path / f"{precision}.json"
        assert main(["-q", "evaluate", "--model", str(run), "--test", str(dev), "--out", str(scores),
                     "--precision", precision]) == 0
        metrics[precision] = json.loads(scores.read_text(encoding="utf-8"))
    for a, b in zip(rows["fp32"], rows["bf16"], strict=True):
        assert b["probabilities"] == pytest.approx(a["probabilities"], abs=0.05)
    assert abs(metrics["bf16"]["accuracy"] - metrics["fp32"]["accuracy"]) <= 0.15
    text = tmp_path / "lines.txt"
    text.write_text("alice went to paris\nbob saw the capital of rome today\n", encoding="utf-8")
    vectors = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"embed-{precision}.npy"
        assert main(["-q", "embed", "--model", str(tiny_encoder_dir), "--input", str(text), "--out", str(out),
                     "--precision", precision]) == 0
        vectors[precision] = np.load(out)
    assert vectors["bf16"].dtype == np.float32
    np.testing.assert_allclose(vectors["bf16"], vectors["fp32"], atol=0.1)


def test_pipeline_and_serve_take_the_precision(finetuned):
    run, _, _ = finetuned("sequence")
    texts = ["alice great today", "bob awful later"]
    want = lmforge.pipeline("text-classification", model=run)(texts)
    got = lmforge.pipeline("text-classification", model=run, precision="bf16")(texts)
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in want], abs=0.05)
    auto = lmforge.pipeline("text-classification", model=run, precision="auto")(texts)
    assert [a["label"] for a in auto] and all(isinstance(a["score"], float) for a in auto)
    with pytest.raises(LmforgeError, match="precision='fp16' is not one of"):
        lmforge.pipeline("text-classification", model=run, precision="fp16")
    with pytest.raises(LmforgeError, match="run in fp32"):
        lmforge.pipeline("text-classification", model=run, precision="bf16", runtime="onnx")
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app

    app = create_app(run, precision="bf16")
    assert app.state.model.precision == "bf16"
    with TestClient(app) as client:
        response = client.post("/classify", json={"texts": texts})
    assert response.status_code == 200, response.text
    with pytest.raises(LmforgeError, match="exclude each other"):
        create_app(run, precision="bf16", runtime="onnx")


def test_precision_with_runtime_onnx_is_one_line(finetuned, tmp_path, capsys):
    run, _, dev = finetuned("sequence")
    code = main(["-q", "predict", "--model", str(run), "--input", str(dev), "--out", str(tmp_path / "p.jsonl"),
                 "--precision", "bf16", "--runtime", "onnx"])
    err = capsys.readouterr().err
    assert code != 0 and "exclude each other" in err and "Traceback" not in err
