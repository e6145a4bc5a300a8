"""precision = "auto": bf16 only where the device runs it natively and measurably faster, decided once, kept on
resume. The decision is exercised with the CPU's capabilities and the measurement replaced, so that the tests do
not depend on the machine's instruction set or its load."""

from __future__ import annotations

import logging

import pytest
import torch

from lmforge.config import TrainConfig
from lmforge.errors import LmforgeError
from lmforge.training import RunOutput, Trainer
from lmforge.training import precision as precision_module
from lmforge.training.precision import MIN_SPEEDUP, matmul_speedup, resolve_precision
from tests.training.helpers import LMObjective, ToyData, tiny_lm, train_config

CPU = torch.device("cpu")


def fake_cpu(monkeypatch, *, native: bool | None, speedup: float = 2.0) -> list[tuple[int, int]]:
    measured: list[tuple[int, int]] = []

    def fake_speedup(d_model: int, d_ff: int, **_: object) -> tuple[float, float, float]:
        measured.append((d_model, d_ff))
        return 1.0, 1.0 / speedup, speedup

    monkeypatch.setattr(precision_module, "native_cpu_bf16", lambda: native)
    monkeypatch.setattr(precision_module, "matmul_speedup", fake_speedup)
    return measured


def test_explicit_precisions_are_kept_without_measuring(monkeypatch):
    measured = fake_cpu(monkeypatch, native=False)
    assert resolve_precision("fp32", CPU).precision == "fp32"
    assert resolve_precision("bf16", CPU).precision == "bf16"  # asked for: honoured (the Trainer warns if emulated)
    assert measured == []


@pytest.mark.parametrize(("native", "speedup", "expected"), [
    (False, 5.0, "fp32"),  # emulated bf16: never, whatever a measurement would say
    (None, 5.0, "fp32"),  # torch cannot tell: fp32
    (True, MIN_SPEEDUP + 0.5, "bf16"),
    (True, MIN_SPEEDUP - 0.2, "fp32"),  # native but too narrow to pay
])
def test_auto_on_a_cpu(monkeypatch, native, speedup, expected):
    measured = fake_cpu(monkeypatch, native=native, speedup=speedup)
    choice = resolve_precision("auto", CPU, d_model=64, d_ff=200)
    assert choice.precision == expected and choice.reason.startswith("auto: ")
    assert measured == ([(64, 200)] if native else [])
    if native:
        assert f"({speedup:.2f}x)" in choice.reason


def test_auto_elsewhere_is_fp32_unless_cuda_supports_bf16():
    assert resolve_precision("auto", torch.device("meta")).precision == "fp32"


def test_the_measurement_reports_both_times():
    fp32_s, bf16_s, ratio = matmul_speedup(16, 32, rows=64, repeats=2)
    assert fp32_s > 0 and bf16_s > 0 and ratio == pytest.approx(fp32_s / bf16_s)


def test_auto_trains_with_the_choice_and_a_resumed_run_keeps_it(monkeypatch, tmp_path, caplog):
    fake_cpu(monkeypatch, native=True, speedup=3.0)
    config = train_config(max_steps=4, save_every=2, precision="auto")
    with caplog.at_level(logging.INFO, logger="lmforge"):
        trainer = Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(tmp_path / "run", progress=False))
    assert trainer.precision == "bf16" and "precision bf16 (auto: native bf16" in caplog.text
    seen = []
    original = trainer._autocast

    def spy():
        ctx = original()
        seen.append(ctx.fast_dtype if ctx._enabled else None)
        return ctx

    trainer._autocast = spy
    trainer.fit()
    assert seen and set(seen) == {torch.bfloat16}
    # the machine now looks different (say, loaded): the resumed run keeps bf16, saved in the checkpoint
    fake_cpu(monkeypatch, native=True, speedup=1.0)
    longer = TrainConfig(**{**config.__dict__, "max_steps": 6})
    resumed = Trainer(tiny_lm(), LMObjective(), ToyData(n=8), longer,
                      RunOutput(tmp_path / "run", resume="auto", progress=False))
    assert resumed.precision == "bf16"
    fresh = Trainer(tiny_lm(), LMObjective(), ToyData(n=8), config, RunOutput(tmp_path / "fresh", progress=False))
    assert fresh.precision == "fp32"


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(LmforgeError, match="precision='fp16' is not one of fp32, bf16, auto"):
        TrainConfig(precision="fp16")
