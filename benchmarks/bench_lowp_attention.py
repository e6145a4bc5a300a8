"""bf16 attention without dropout on a CPU: torch's flash kernel against lmforge's ``lowp_attention`` (issue 39).

Under bf16 autocast ``scaled_dot_product_attention`` runs its CPU flash kernel in bf16, whose backward is several
times its fp32 one. ``lmforge.nn.kernels.lowp_attention`` computes the scores and softmax in fp32 in row chunks sized
to the level-2 cache (``sdpa_attention`` takes it for bf16 / fp16 operands without dropout). This script times, at
each shape, one attention call (forward + backward, and forward alone) for:

- ``flash bf16``: torch's SDPA on bf16 operands (what lmforge ran before and what transformers' "sdpa" runs);
- ``lowp bf16``: lmforge's kernel;
- ``bf16 scores``: softmax(fp32(q k^T in bf16)) in bf16 @ v, as transformers' "eager" attention computes under
  autocast (for reference: a coarser result, see the error column);
- ``flash fp32``: torch's SDPA in fp32.

Sides alternate in rounds (median of each), one thread. The error columns are the relative L2 error of the output
and of dq against fp64 attention on the same inputs. ``--step`` also times the bert-mini pretraining step of the
small-budget recipe (``configs/bert-mini-small-budget.toml``'s model: pre-LN, rotary, untied, 32 x 64, MLM 40%,
bf16 autocast) with the kernel and with torch's flash kernel in its place, alternating. With dropout (0.1), the kernel
is timed against the earlier bf16 path: ``dropout_attention`` on fp32 copies of q, k and v.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lowp_attention.py [--rounds 5] [--step]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from common import markdown_table, print_machine, reproduce_command
from lmforge.nn.kernels.lowp_attention import lowp_attention

lowp_module = importlib.import_module("lmforge.nn.kernels.lowp_attention")

SHAPES = [  # (B, H, T, Dh, mask), what they stand for
    ((32, 4, 64, 64, None), "bert-mini pretraining, 32 x 64"),
    ((32, 4, 128, 64, "padding"), "bert-mini, 32 x 128, half the rows padded to half"),
    ((8, 12, 128, 64, "padding"), "bert-base, 8 x 128, padded"),
    ((16, 4, 128, 64, "causal"), "gpt-mini, 16 x 128, causal"),
    ((8, 12, 256, 64, None), "bert-base, 8 x 256"),
    ((4, 12, 512, 64, None), "bert-base, 4 x 512 (inference only)"),
]


def make_mask(B: int, T: int, kind: str | None) -> torch.Tensor | None:
    if kind == "padding":
        mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
        mask[::2, ..., T // 2:] = False
        return mask
    if kind == "causal":
        return torch.ones(T, T, dtype=torch.bool).tril()
    return None


def sides(mask: torch.Tensor | None) -> dict[str, tuple[Callable[..., torch.Tensor], torch.dtype]]:
    def flash(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def bf16_scores(q, k, v):
        scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        return scores.softmax(-1).to(q.dtype) @ v

    return {"flash bf16": (flash, torch.bfloat16), "lowp bf16": (lambda q, k, v: lowp_attention(q, k, v, mask),
                                                                torch.bfloat16),
            "bf16 scores": (bf16_scores, torch.bfloat16), "flash fp32": (flash, torch.float32)}


def time_call(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], cotangent: torch.Tensor,
              backward: bool) -> float:
    start = time.perf_counter()
    if backward:
        out = fn(*inputs)
        out.backward(cotangent)
    else:
        with torch.no_grad():
            fn(*inputs)
    return time.perf_counter() - start


def errors(fn: Callable[..., torch.Tensor], dtype: torch.dtype, base: list[torch.Tensor], mask: torch.Tensor | None,
           cotangent: torch.Tensor) -> tuple[float, float]:
    def run(f, dt):
        x = [t.detach().to(dt).requires_grad_() for t in base]
        out = f(*x)
        (dq,) = torch.autograd.grad(out, [x[0]], cotangent.to(dt))
        return out.detach().double(), dq.double()

    exact = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.float64)
    got = run(fn, dtype)
    return tuple(float((g - e).norm() / e.norm()) for g, e in zip(got, exact, strict=True))  # type: ignore[return-value]


def bench_shapes(rounds: int) -> None:
    rows = []
    for (B, H, T, Dh, kind), label in SHAPES:
        torch.manual_seed(0)
        mask = make_mask(B, T, kind)
        base = [torch.randn(B, H, T, Dh) * s for s in (2.0, 2.0, 1.0)]
        cotangent = torch.randn(B, H, T, Dh)
        train = T <= 256
        fns = sides(mask)
        inputs = {name: [t.to(dt).requires_grad_() for t in base] for name, (_, dt) in fns.items()}
        cots = {name: cotangent.to(dt) for name, (_, dt) in fns.items()}
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(2):  # warm-up
            for name, (fn, _) in fns.items():
                for backward in (True, False) if train else (False,):
                    time_call(fn, inputs[name], cots[name], backward)
        for _ in range(rounds):
            for name, (fn, _) in fns.items():
                for backward in (True, False) if train else (False,):
                    times.setdefault((name, backward), []).append(
                        time_call(fn, inputs[name], cots[name], backward))
        med = {key: 1000 * statistics.median(v) for key, v in times.items()}
        for name, (fn, dt) in fns.items():
            out_err, dq_err = errors(fn, dt, base, mask, cotangent)
            fb = med.get((name, True))
            rows.append([label if name == "flash bf16" else "", name,
                         f"{fb:.2f}" if fb is not None else "-",
                         f"{med[('flash bf16', True)] / fb:.2f}x" if fb is not None else "-",
                         f"{med[(name, False)]:.2f}", f"{med[('flash bf16', False)] / med[(name, False)]:.2f}x",
                         f"{out_err:.2e}", f"{dq_err:.2e}"])
    print(markdown_table(["shape (B, H, T, Dh = 64)", "side", "fwd + bwd ms", "vs flash bf16", "fwd ms",
                          "vs flash bf16", "out error", "dq error"], rows, align="llrrrrrr"))


def bench_dropout(rounds: int) -> None:
    """bf16 attention with dropout 0.1, forward + backward: lowp_attention against the earlier bf16 path,
    ``dropout_attention`` on fp32 copies of q, k and v with autocast off."""
    from lmforge.nn.kernels.dropout_attention import dropout_attention

    def fp32_copies(q, k, v, mask):
        return dropout_attention(q.float(), k.float(), v.float(), mask, 0.1).to(q.dtype)

    def lowp(q, k, v, mask):
        return lowp_attention(q, k, v, mask, dropout_p=0.1)

    rows = []
    for (B, H, T, Dh, kind), label in SHAPES[:4]:
        torch.manual_seed(0)
        mask = make_mask(B, T, kind)
        inputs = [torch.randn(B, H, T, Dh).to(torch.bfloat16).requires_grad_() for _ in range(3)]
        cotangent = torch.randn(B, H, T, Dh).to(torch.bfloat16)
        fns = {"fp32 copies": fp32_copies, "lowp": lowp}
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(2):
            for fn in fns.values():
                time_call(lambda *x, f=fn, m=mask: f(*x, m), inputs, cotangent, True)
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(time_call(lambda *x, f=fn, m=mask: f(*x, m), inputs, cotangent, True))
        old, new = (1000 * statistics.median(times[n]) for n in fns)
        rows.append([label, f"{old:.2f}", f"{new:.2f}", f"{old / new:.2f}x"])
    print(markdown_table(["bf16, dropout 0.1, fwd + bwd", "dropout_attention on fp32 copies ms", "lowp ms",
                          "speed-up"], rows, align="lrrr"))


def bench_step(rounds: int) -> None:
    """The recipe's pretraining step (bert-mini-budget, 32 x 64, MLM 40%, bf16 autocast, AdamW) with and without
    lowp_attention, alternating."""
    from lmforge.config import model_config_from_preset
    from lmforge.heads import TaskModel, build_head
    from lmforge.models.encoder import Encoder
    from lmforge.objectives import MaskedLMObjective

    config = model_config_from_preset("bert-mini-budget", vocab_size=8000, max_seq_len=64).without_dropout()
    torch.manual_seed(0)
    encoder = Encoder(config)
    model = TaskModel(encoder, build_head({"type": "mlm"}, config, encoder)).train()
    objective = MaskedLMObjective()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 8000, (32, 64), generator=g)
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(32, 64, generator=g) < 0.4
    labels[chosen] = ids[chosen]
    ids = ids.masked_fill(chosen, 4)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mlm_labels": labels}
    limit = lowp_module.LOWP_MAX_TRAIN_SCORES

    def step(use: bool) -> float:
        lowp_module.LOWP_MAX_TRAIN_SCORES = limit if use else 0
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, n = objective(model, batch).losses["mlm"]
        (loss / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for use in (True, False, True, False):
        step(use)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds * 4):
        for use in (True, False):
            times[use].append(step(use))
    lowp_module.LOWP_MAX_TRAIN_SCORES = limit
    on, off = (1000 * statistics.median(times[u]) for u in (True, False))
    print(markdown_table(["bert-mini-budget pretraining step, 32 x 64, bf16", "ms", "steps per minute"],
                         [["torch's flash kernel (before)", f"{off:.1f}", f"{60000 / off:.0f}"],
                          ["lmforge lowp_attention", f"{on:.1f}", f"{60000 / on:.0f}"],
                          ["ratio", f"{off / on:.2f}x", ""]], align="lrr"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--step", action="store_true", help="also time the recipe's pretraining step")
    parser.add_argument("--no-shapes", action="store_true", help="the step only")
    args = parser.parse_args(argv)
    print("# bf16 attention without dropout: torch's flash kernel against lmforge's lowp_attention\n")
    print(f"`{reproduce_command(__file__, sys.argv[1:] if argv is None else argv)}`\n")
    print_machine()
    print(f"torch threads: {torch.get_num_threads()}\n")
    if not args.no_shapes:
        bench_shapes(args.rounds)
        print()
        bench_dropout(args.rounds)
        print()
    if args.step:
        bench_step(args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
