"""``precision = "auto"``: bf16 autocast where the device runs it natively AND faster for this model, fp32 elsewhere.

Machines differ: an AMD EPYC with AVX512_BF16 multiplies bf16 matrices about twice as fast as fp32, an AVX2-only one
emulates bf16 and is several times slower, and on either a small model's matrices may be too narrow for bf16 to pay
(autocast also casts every weight on every forward pass). So "auto" never assumes:

- CUDA: bf16 where ``torch.cuda.is_bf16_supported()`` (Ampere and later), else fp32.
- CPU: fp32 without AVX512_BF16 or AMX (bf16 would be emulated); with them, one measurement on this model's shape,
  a (2048 x d_model) @ (d_model x d_ff) product (the feed-forward's first matrix, the largest GEMM of a layer) in
  fp32 and in bf16, best of several repetitions, side by side: bf16 is chosen only when it is at least
  ``MIN_SPEEDUP`` times faster, so that the cast overhead cannot make the run slower than fp32.
- any other device: fp32.

The choice is made once per run (rank 0 decides, every process follows) and saved in each checkpoint, so a resumed
run keeps the precision it started with, whatever the machine's load when it resumes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmforge.utils.hardware import native_cpu_bf16

MIN_SPEEDUP = 1.3  # bf16 matmul speed-up below which "auto" keeps fp32 (the casts and norms eat the rest)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in, and why (logged at the start of the run)."""

    precision: str  # "fp32" or "bf16"
    reason: str


def matmul_speedup(d_model: int, d_ff: int, *, rows: int = 2048, repeats: int = 5) -> tuple[float, float, float]:
    """(fp32 seconds, bf16 seconds, fp32 / bf16) of a (rows x d_model) @ (d_model x d_ff) product on the CPU, each
    the best of ``repeats`` after one warm-up, measured alternately so that both see the same load."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, d_model, generator=generator)
    b = torch.randn(d_model, d_ff, generator=generator)
    a16, b16 = a.bfloat16(), b.bfloat16()
    best = {"fp32": float("inf"), "bf16": float("inf")}
    with torch.no_grad():
        for i in range(repeats + 1):
            for name, (x, y) in (("fp32", (a, b)), ("bf16", (a16, b16))):
                start = time.perf_counter()
                torch.mm(x, y)
                elapsed = time.perf_counter() - start
                if i:  # the first round warms the kernels up
                    best[name] = min(best[name], elapsed)
    return best["fp32"], best["bf16"], best["fp32"] / max(best["bf16"], 1e-12)


def resolve_precision(requested: str, device: torch.device, *, d_model: int = 256,
                      d_ff: int | None = None) -> PrecisionChoice:
    """The precision to train in for ``requested`` ("fp32", "bf16" or "auto") on ``device`` (see the module
    docstring); ``d_model`` and ``d_ff`` (default 4 x d_model) size the CPU measurement."""
    if requested != "auto":
        return PrecisionChoice(requested, "as configured")
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", f"auto: {torch.cuda.get_device_name(device)} supports bf16")
        return PrecisionChoice("fp32", f"auto: {torch.cuda.get_device_name(device)} has no bf16 support")
    if device.type != "cpu":
        return PrecisionChoice("fp32", f"auto: bf16 autocast is not chosen automatically on {device.type}")
    native = native_cpu_bf16()
    if not native:
        why = "this torch cannot detect the CPU's bf16 support" if native is None else \
            "the CPU has neither AVX512_BF16 nor AMX, so bf16 matmuls would be emulated (several times slower)"
        return PrecisionChoice("fp32", f"auto: {why}")
    width = d_ff or 4 * d_model
    fp32_s, bf16_s, speedup = matmul_speedup(d_model, width)
    measured = (f"a 2048 x {d_model} @ {d_model} x {width} matmul took {fp32_s * 1e3:.2f} ms in fp32 and "
                f"{bf16_s * 1e3:.2f} ms in bf16 ({speedup:.2f}x)")
    if speedup >= MIN_SPEEDUP:
        return PrecisionChoice("bf16", f"auto: native bf16 on this CPU; {measured}")
    return PrecisionChoice("fp32", f"auto: native bf16 on this CPU but too little gain at this width "
                                   f"(< {MIN_SPEEDUP}x); {measured}")


def to_fp32(value: Any) -> Any:
    """``value`` with every bf16 / fp16 tensor inside (a tensor, NamedTuple, dataclass, tuple, list or dict) as
    fp32; everything else unchanged."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (the models' outputs)
        return type(value)(*(to_fp32(v) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: to_fp32(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, (list, tuple)):
        return type(value)(to_fp32(v) for v in value)
    if isinstance(value, dict):
        return {k: to_fp32(v) for k, v in value.items()}
    return value


def autocast_inference(model: nn.Module, requested: str) -> PrecisionChoice:
    """Make ``model`` run in the precision ``requested`` ("fp32", "bf16" or "auto", resolved as for training) for
    inference (``predict``, ``evaluate``, ``embed``, ``serve``, ``pipeline``): in bf16 its forward runs under
    autocast and every floating output comes back as fp32, so what reads the outputs (softmax, decoding, saved
    vectors) is unchanged. Works with ``compile_in_place`` in either order. Returns the choice (to log)."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    config = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    d_model = getattr(config, "d_model", None) or 256
    choice = resolve_precision(requested, device, d_model=d_model, d_ff=getattr(config, "d_ff", None))
    if choice.precision == "bf16":
        autocast_forward(model)
    return choice


def autocast_forward(model: nn.Module) -> None:
    """Run ``model``'s forward under bf16 autocast (on its device) with its floating outputs back in fp32: the
    wrapping ``autocast_inference`` applies once the precision is resolved."""
    param = next(model.parameters(), None)
    device_type = param.device.type if param is not None else "cpu"
    forward = model.forward

    def bf16_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=torch.bfloat16):
            out = forward(*args, **kwargs)
        return to_fp32(out)

    model.forward = bf16_forward  # an instance attribute: nn.Module.__call__ (and a compiled one) calls it
