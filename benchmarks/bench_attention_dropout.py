"""What attention dropout costs on a CPU, and the cheaper forms tried for it (issue 22, item 2).

On a CPU, ``F.scaled_dot_product_attention`` with ``dropout_p > 0`` leaves the fused (flash) kernel for the math path:
the (B, H, T, T) scores are formed, soft-maxed, masked by a Bernoulli draw and multiplied by V, each a pass over
memory, and backward again. This script times one attention call forward + backward at a fine-tuning shape for:

- ``sdpa, no dropout``: the fused kernel (what evaluation and dropout-free training get);
- ``sdpa, dropout``: PyTorch's math path with dropout (what lmforge and Hugging Face both run when fine-tuning);
- ``custom, int16 mask``: an autograd function written for this: one ``baddbmm`` for scores + mask, an in-place
  softmax, a keep mask from 16-bit random integers against a threshold (keep probability 1 - round(p 2^15) / 2^15,
  rescaled by its exact inverse), and a backward that reuses the saved probabilities with the row-sum trick of
  flash attention (D_i = dO_i . O_i) instead of a second reduction over the scores;
- ``compiled math``: the math path with dropout through ``torch.compile`` (inductor fuses the element-wise passes and
  draws its own random numbers).

And the dropout masks alone, on the same (B, H, T, T) shape: ``bernoulli_`` (what ``F.dropout`` draws),
``torch.rand < p``, and 16-bit random integers against a threshold.

    .venv/bin/python benchmarks/bench_attention_dropout.py [--batch 16 --heads 12 --length 128 --head-dim 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from common import print_machine, reproduce_command


class Int16DropoutAttention(torch.autograd.Function):
    """softmax(q k^T scale + bias) with dropout from a 16-bit threshold, times v; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, bias, p, scale):  # type: ignore[override]
        B, H, T, Dh = q.shape
        S = k.shape[-2]
        qf, kf, vf = q.reshape(B * H, T, Dh), k.reshape(B * H, S, Dh), v.reshape(B * H, S, Dh)
        scores = torch.baddbmm(bias.expand(B, H, T, S).reshape(B * H, T, S), qf, kf.transpose(1, 2), alpha=scale)
        probs = torch.softmax(scores, dim=-1)  # (BH, T, S)
        threshold = round(p * 32768)
        keep = torch.empty(probs.shape, dtype=torch.int16).random_(0, 32768) >= threshold  # bool
        inv = 32768.0 / (32768 - threshold)
        out = torch.bmm(probs.masked_fill(~keep, 0.0), vf).mul_(inv)
        ctx.save_for_backward(qf, kf, vf, probs, keep, out)
        ctx.inv, ctx.scale, ctx.shape = inv, scale, (B, H, T, S, Dh)
        return out.view(B, H, T, Dh)

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        qf, kf, vf, probs, keep, out = ctx.saved_tensors
        B, H, T, S, Dh = ctx.shape
        do = dout.reshape(B * H, T, Dh)
        dv = torch.bmm(probs.masked_fill(~keep, 0.0).transpose(1, 2), do).mul_(ctx.inv)
        grad = torch.bmm(do, vf.transpose(1, 2)).masked_fill_(~keep, 0.0).mul_(ctx.inv)  # d(dropped probs)
        grad.sub_((do * out).sum(-1, keepdim=True)).mul_(probs)  # d(scores): P (dP - D)
        dq = torch.bmm(grad, kf).mul_(ctx.scale)
        dk = torch.bmm(grad.transpose(1, 2), qf).mul_(ctx.scale)
        return dq.view(B, H, T, Dh), dk.view(B, H, S, Dh), dv.view(B, H, S, Dh), None, None, None


def median_ms(fns: dict, repeats: int, inner: int) -> dict[str, float]:
    """Median ms per call of each function, the functions interleaved (the order flips every repeat)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up (and compilation)
    for r in range(repeats):
        for name, fn in (list(fns.items()) if r % 2 == 0 else list(reversed(fns.items()))):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) / inner * 1000)
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(reproduce_command(__file__, sys.argv[1:] if argv is None else argv))
    print_machine()
    B, H, T, Dh, drop = args.batch, args.heads, args.length, args.head_dim, args.dropout
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[: B // 2, ..., 3 * T // 4:] = False  # half the rows padded by a quarter
    bias = torch.zeros(B, 1, 1, T).masked_fill(~mask, float("-inf"))
    scale = Dh ** -0.5

    def math(q, k, v, mask):
        weights = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")), dim=-1)
        return F.dropout(weights, drop, training=True) @ v

    compiled = torch.compile(math)
    # correctness of the custom function: without dropout it equals the fused kernel, gradients included
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    g = torch.randn_like(ref)
    got = Int16DropoutAttention.apply(q, k, v, bias, 0.0, scale)
    diff = max((a - b).abs().max().item() for a, b in zip(torch.autograd.grad(ref, (q, k, v), g),
                                                          torch.autograd.grad(got, (q, k, v), g), strict=True))
    print(f"custom function at p = 0 against the fused kernel: output max |diff| "
          f"{(got - ref).abs().max().item():.1e}, gradients {diff:.1e}")

    def fwd_bwd(fn):
        return lambda: fn().sum().backward()

    attention = {
        "sdpa, no dropout (fused kernel)": fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
        "sdpa, dropout (math path)": fwd_bwd(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                                   dropout_p=drop)),
        "custom, int16 mask": fwd_bwd(lambda: Int16DropoutAttention.apply(q, k, v, bias, drop, scale)),
        "compiled math path (inductor)": fwd_bwd(lambda: compiled(q, k, v, mask)),
    }
    shape = (B, H, T, T)
    probs = torch.rand(shape)
    masks = {
        "F.dropout (bernoulli_ + scale)": lambda: F.dropout(probs, drop, training=True),
        "bernoulli_ alone": lambda: torch.empty(shape).bernoulli_(1 - drop),
        "torch.rand >= p": lambda: torch.rand(shape) >= drop,
        "int16 random >= threshold": lambda: torch.empty(shape, dtype=torch.int16).random_(0, 32768) >= round(
            drop * 32768),
    }
    a = median_ms(attention, args.repeats, 3)
    m = median_ms(masks, args.repeats, 3)
    base = a["sdpa, dropout (math path)"]
    print(f"\nOne attention call, forward + backward, (B, H, T, Dh) = {(B, H, T, Dh)}, dropout {drop}, "
          f"{args.threads} thread(s), median of {args.repeats} interleaved repeats:\n")
    print("| variant | ms | vs sdpa with dropout |\n| --- | ---: | ---: |")
    for name, ms in a.items():
        print(f"| {name} | {ms:.1f} | {base / ms:.2f}x |")
    print(f"\nThe dropout mask alone, shape {shape}:\n")
    print("| mask | ms |\n| --- | ---: |")
    for name, ms in m.items():
        print(f"| {name} | {ms:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
