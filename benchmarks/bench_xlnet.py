"""XLNet pretraining throughput: lmforge's ``XLNet`` against ``transformers.XLNetLMHeadModel``, same weights, same
batches, one process (issue 19: training tokens/s, target at least parity).

Models: an lmforge ``XLNet`` from a preset (``xlnet-tiny`` by default: 4 layers, 128 wide, 4 heads, d_inner 512) with
``--vocab`` words (default 8,000), and a ``transformers.XLNetLMHeadModel`` built from ``config_to_hf`` of the same
config and loaded with ``state_dict_to_hf`` of our weights. Before timing, a forward pass in eval mode checks that
the two agree on the batch (query-stream logits at the predicted positions, the content stream, the loss) and the
largest differences are printed; a difference above 1e-3 stops the run.

Batches: B x T seeded random token ids, two segments per row (``token_type_ids`` 0 then 1 from a random boundary),
no padding (``attention_mask`` all ones, passed to both sides). Each row's PLM inputs come from
``lmforge.data.permutation.plm_example`` (XLNet's span targets, K = 6, a random factorisation order):
``perm_mask`` is the query stream's mask (True = may not see; lmforge gets it as bool, Hugging Face as float 1/0,
the same layout), ``target_mapping`` (B, N, T) with N = ceil(T / 6) rows, ``labels`` (B, N) with -100 on unused rows.

One step = forward (both streams, with ``target_mapping``) + cross-entropy over the real targets + backward +
AdamW step + ``zero_grad()``, in train mode with each model's configured dropout (0.1). Ours runs lmforge's
``PLMObjective`` (the vocabulary projection at the real targets only; the summed loss divided by their count); theirs
is ``XLNetLMHeadModel(..., labels=labels).loss`` (projection at all N rows, mean over the real ones). Both optimizers
come from lmforge's ``build_optimizer`` with the same ``TrainConfig`` (AdamW, lr 1e-4, weight decay 0.01 on matrices,
fused where torch supports it), so class, groups and options are identical. No gradient clipping on either side.
After warm-up steps, the two sides alternate one step at a time (the order flips every round); the median step time
of each side is reported, tokens/s = B x T / median step time, and ours/HF = HF's median / ours (above 1: lmforge is
faster).

Run: ``.venv/bin/python benchmarks/bench_xlnet.py [--quick] [--preset xlnet-tiny] [--vocab 8000] [--batch 16]
[--seq-len 128] [--steps 20] [--warmup 3] [--threads N]``. ``--quick`` (a smoke test): B = 2, T = 32, 2 timed steps.
Prints Markdown and writes ``benchmarks/results/xlnet.json`` (``xlnet-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import (
    allocator,
    fmt,
    fmt_ratio,
    machine_description,
    markdown_table,
    print_machine,
    reproduce_command,
)
from lmforge.config import ModelConfig, TrainConfig, model_config_from_preset
from lmforge.data.permutation import plm_example
from lmforge.interop.hf_xlnet import config_to_hf, state_dict_to_hf
from lmforge.models.xlnet import XLNet
from lmforge.objectives.plm import PLMObjective
from lmforge.training.optim import build_optimizer
from lmforge.utils.io import atomic_write_text

HERE = Path(__file__).resolve().parent
TARGET = 1.0  # ours / HF tokens/s, issue 19: at least parity
PARTIAL_K = 6  # XLNet's K: about 1/6 of the tokens are predicted
AGREEMENT_TOL = 1e-3  # largest allowed absolute difference of the eval-mode forward check
FIRST_ID = 10  # random ids are drawn from [FIRST_ID, vocab): clear of the low special ids


# ---------------------------------------------------------------------------------------------- models
def build_models(preset: str, vocab: int, seed: int) -> tuple[XLNet, torch.nn.Module, ModelConfig]:
    """Our XLNet (seeded init) and a transformers ``XLNetLMHeadModel`` holding the same weights, both in train mode."""
    import transformers

    cfg = model_config_from_preset(preset, vocab_size=vocab)
    torch.manual_seed(seed)
    ours = XLNet(cfg)
    hf_dict = {k: v for k, v in config_to_hf(cfg).items() if k not in ("architectures", "model_type")}
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**hf_dict))
    hf.load_state_dict(state_dict_to_hf(ours.state_dict(), include_tied=True), strict=True)
    if hf.lm_loss.weight.data_ptr() != hf.transformer.word_embedding.weight.data_ptr():
        raise AssertionError("HF's lm_loss.weight is not tied to its word embedding after loading")
    return ours.train(), hf.train(), cfg


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights once


# ---------------------------------------------------------------------------------------------- batches
def plm_batch(batch: int, seq_len: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """A PLM batch in lmforge's conventions (plan "plm"): one ``plm_example`` per row, stacked."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        ids = rng.integers(FIRST_ID, vocab, size=seq_len, dtype=np.int64)
        rows.append(plm_example(ids, rng=rng, special_mask=np.zeros(seq_len, dtype=bool), partial_k=PARTIAL_K))
    boundary = rng.integers(1, seq_len, size=batch)  # segment B starts there
    token_type_ids = (np.arange(seq_len)[None, :] >= boundary[:, None]).astype(np.int64)
    return {
        "input_ids": torch.from_numpy(np.stack([r["input_ids"] for r in rows])),
        "attention_mask": torch.ones(batch, seq_len, dtype=torch.long),
        "token_type_ids": torch.from_numpy(token_type_ids),
        "perm_mask": torch.from_numpy(np.stack([r["query_perm_mask"] for r in rows])),  # (B, T, T) bool, query stream
        "target_mapping": torch.from_numpy(np.stack([r["target_mapping"] for r in rows])),  # (B, N, T) float32
        "target_mask": torch.from_numpy(np.stack([r["target_mask"] for r in rows])),  # (B, N) bool
        "labels": torch.from_numpy(np.stack([r["labels"] for r in rows])),  # (B, N), -100 on unused rows
    }


def hf_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same batch in Hugging Face's conventions: float ``perm_mask`` (1 = may not see, the query stream's, same
    layout), float ``attention_mask``; ``target_mapping`` (B, N, T) and ``labels`` (B, N) as they are."""
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"].float(),
            "token_type_ids": batch["token_type_ids"], "perm_mask": batch["perm_mask"].float(),
            "target_mapping": batch["target_mapping"]}


# ---------------------------------------------------------------------------------------------- agreement
@torch.no_grad()
def forward_check(ours: XLNet, hf: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Eval-mode forward of both sides on the batch: the largest absolute differences (query-stream logits at the
    real targets and at every row, content stream after the last layer, loss)."""
    ours.eval()
    hf.eval()
    try:
        out = ours(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                   perm_mask=batch["perm_mask"], target_mapping=batch["target_mapping"])
        logits = ours.lm_logits(out.query_state)  # (B, N, V)
        ref = hf(**hf_inputs(batch), labels=batch["labels"], output_hidden_states=True)
        real = batch["labels"] != -100
        loss = torch.nn.functional.cross_entropy(logits[real], batch["labels"][real])
        return {
            "query_logits_real_rows": float((logits[real] - ref.logits[real]).abs().max()),
            "query_logits_all_rows": float((logits - ref.logits).abs().max()),
            "content_stream": float((out.last_hidden_state - ref.hidden_states[-2]).abs().max()),  # (h_L, g_L) pairs
            "loss": abs(float(loss) - float(ref.loss)),
            "loss_lmforge": float(loss),
            "loss_hf": float(ref.loss),
        }
    finally:
        ours.train()
        hf.train()


# ---------------------------------------------------------------------------------------------- steps
def make_steps(ours: XLNet, hf: torch.nn.Module, batch: dict[str, torch.Tensor],
               train_config: TrainConfig) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, str]]:
    """One training step of each side (returning its detached loss), and a description of each optimizer."""
    opt_ours = build_optimizer(ours, train_config)
    opt_hf = build_optimizer(hf, train_config)
    objective = PLMObjective()
    theirs = hf_inputs(batch)
    labels = batch["labels"]

    def step_ours() -> torch.Tensor:
        out = objective(ours, batch)
        total, count = out.losses["plm"]
        loss = total / count
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad()
        return loss.detach()

    def step_hf() -> torch.Tensor:
        loss = hf(**theirs, labels=labels).loss
        loss.backward()
        opt_hf.step()
        opt_hf.zero_grad()
        return loss.detach()

    def describe(opt: torch.optim.Optimizer) -> str:
        fused = any(g.get("fused") for g in opt.param_groups)
        sizes = ", ".join(f"{sum(p.numel() for p in g['params']):,} (wd {g['weight_decay']})" for g in opt.param_groups)
        return f"{type(opt).__name__}({'fused' if fused else 'not fused'}; groups: {sizes})"

    return {"lmforge": step_ours, "HF": step_hf}, {"lmforge": describe(opt_ours), "HF": describe(opt_hf)}


def time_alternating(steps: dict[str, Callable[[], torch.Tensor]], n_steps: int,
                     warmup: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds of each timed step per side, the sides alternating step by step (the order flips every round), and
    each side's loss at its first (warm-up) step."""
    names = list(steps)
    first: dict[str, float] = {}
    for name in names:
        for i in range(warmup):
            loss = float(steps[name]())
            if not math.isfinite(loss):
                raise AssertionError(f"{name}: non-finite loss {loss} during warm-up")
            if i == 0:
                first[name] = loss
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(n_steps):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
    return times, first


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke test: batch 2, length 32, 1 warm-up and 2 timed "
                                                        "steps per side")
    p.add_argument("--preset", default="xlnet-tiny", help="lmforge XLNet preset (default xlnet-tiny)")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size (default 8000)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 16; 2 with --quick)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 128; 32 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per side (default 20; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per side first (default 3; 1 with "
                                                            "--quick)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's, which "
                                                             "follows OMP_NUM_THREADS)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    batch_size = args.batch or (2 if args.quick else 16)
    seq_len = args.seq_len or (32 if args.quick else 128)
    steps = args.steps or (2 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if min(batch_size, seq_len, steps, warmup) < 1 or seq_len < 2:
        p.error("--batch, --steps and --warmup must be >= 1, --seq-len >= 2")
    if args.vocab <= FIRST_ID:
        p.error(f"--vocab must be above {FIRST_ID}")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description()

    print(f"{args.preset}: building both models...", file=sys.stderr, flush=True)
    ours, hf, cfg = build_models(args.preset, args.vocab, args.seed)
    n_ours, n_hf = param_count(ours), param_count(hf)
    if n_ours != n_hf:
        raise AssertionError(f"parameter counts differ: lmforge {n_ours:,}, HF {n_hf:,}")
    batch = plm_batch(batch_size, seq_len, args.vocab, args.seed)
    n_rows = batch["labels"].shape[1]
    predicted = int((batch["labels"] != -100).sum())

    check = forward_check(ours, hf, batch)
    print(f"forward check (eval mode): max |diff| query logits {check['query_logits_real_rows']:.2e} (real rows), "
          f"{check['query_logits_all_rows']:.2e} (all rows), content stream {check['content_stream']:.2e}, loss "
          f"{check['loss']:.2e}", file=sys.stderr, flush=True)
    if max(check["query_logits_real_rows"], check["content_stream"], check["loss"]) > AGREEMENT_TOL:
        raise AssertionError(f"lmforge's and HF's forward passes differ by more than {AGREEMENT_TOL}: {check}")

    train_config = TrainConfig()
    fns, optimizers = make_steps(ours, hf, batch, train_config)
    print(f"{warmup} warm-up + {steps} timed steps per side...", file=sys.stderr, flush=True)
    wall = time.perf_counter()
    times, first = time_alternating(fns, steps, warmup)
    wall = time.perf_counter() - wall
    med = {side: statistics.median(t) for side, t in times.items()}
    tokens = batch_size * seq_len
    ratio = med["HF"] / med["lmforge"]
    print(f"  {wall:.1f} s; lmforge {med['lmforge'] * 1e3:.1f} ms, HF {med['HF'] * 1e3:.1f} ms per step",
          file=sys.stderr, flush=True)

    command = reproduce_command(__file__, list(argv if argv is not None else sys.argv[1:]))
    preload = os.environ.get("LD_PRELOAD", "")
    if preload:
        command = f"LD_PRELOAD={preload} {command}"
    omp = os.environ.get("OMP_NUM_THREADS")
    if omp and not args.threads:
        command = f"OMP_NUM_THREADS={omp} {command}"
    verdict = "PASS" if ratio >= TARGET else "MISS"
    chance = math.log(args.vocab)

    print("# XLNet pretraining throughput: lmforge vs Hugging Face transformers\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{command}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    print(f"- torch threads: {torch.get_num_threads()}")
    print(f"- Allocator (both sides, one process): {allocator()}; the CPU, cores and threads apply to both alike")
    print(f"- Load average (1, 5, 15 min) at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(f"Training steps of permutation language modelling (forward of both streams with `target_mapping` + "
          f"cross-entropy over the real targets + backward + AdamW + zero_grad), train mode, dropout "
          f"{cfg.dropout}; {warmup} warm-up step(s) per side, then {steps} timed steps per side, alternating step by "
          "step (the order flips every round). \"step ms\" is the median, \"range ms\" the fastest and slowest step. "
          "Tokens/s = batch x length / median step time; ours/HF = HF's median / ours (above 1: lmforge is "
          "faster).\n")
    print(f"- Model: `{args.preset}` ({cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, d_inner "
          f"{cfg.d_ff}), vocabulary {args.vocab:,}: {n_ours:,} parameters on each side, same weights "
          f"(lmforge's `state_dict_to_hf` into `transformers.XLNetLMHeadModel`)")
    print(f"- Batch: {batch_size} x {seq_len} tokens, two segments per row, PLM inputs from `plm_example` (K = "
          f"{PARTIAL_K}): {n_rows} prediction rows per sequence, {predicted:,} real targets per step on each side")
    print(f"- Forward check (eval mode, same batch), largest |lmforge - HF|: query-stream logits "
          f"{check['query_logits_real_rows']:.2e} at the real targets ({check['query_logits_all_rows']:.2e} over "
          f"every row), content stream {check['content_stream']:.2e}, loss {check['loss']:.2e} "
          f"({check['loss_lmforge']:.4f} vs {check['loss_hf']:.4f})")
    print(f"- Optimizers (lmforge's `build_optimizer`, lr {train_config.lr}, weight decay "
          f"{train_config.weight_decay}): lmforge {optimizers['lmforge']}; HF {optimizers['HF']}")
    print(f"- First-step (train mode) loss: lmforge {first['lmforge']:.3f}, HF {first['HF']:.3f} (chance level "
          f"{chance:.3f})\n")
    rows = []
    for side in ("lmforge", "HF"):
        t = times[side]
        rows.append([args.preset, side, f"{batch_size} x {seq_len}", fmt(med[side] * 1e3, 1),
                     f"{min(t) * 1e3:,.1f}–{max(t) * 1e3:,.1f}", fmt(tokens / med[side], 0),
                     fmt(predicted / med[side], 0), fmt_ratio(ratio) if side == "lmforge" else ""])
    print(markdown_table(["Model", "Side", "batch", "step ms", "range ms", "tokens/s", "targets/s", "ours/HF"], rows,
                         "lllrrrrr"))
    print()
    print(f"{verdict}: {args.preset} lmforge/HF training tokens/s = {ratio:.2f}x (target >= {TARGET:.1f}x)")

    result: dict[str, Any] = {
        "machine": machine,
        "command": command,
        "settings": {"preset": args.preset, "vocab": args.vocab, "batch": batch_size, "seq_len": seq_len,
                     "steps": steps, "warmup": warmup, "threads": torch.get_num_threads(), "seed": args.seed,
                     "partial_k": PARTIAL_K, "prediction_rows": n_rows, "predicted_tokens": predicted,
                     "dropout": cfg.dropout, "lr": train_config.lr, "weight_decay": train_config.weight_decay,
                     "quick": args.quick},
        "parameters": n_ours,
        "optimizers": optimizers,
        "forward_check": check,
        "first_loss": first,
        "step_seconds": times,
        "median_step_seconds": med,
        "tokens_per_second": {side: tokens / med[side] for side in med},
        "ratio_lmforge_over_hf": ratio,
        "target": TARGET,
        "verdict": verdict,
        "load_average_end": list(os.getloadavg()),
    }
    path = HERE / "results" / ("xlnet-quick.json" if args.quick else "xlnet.json")
    atomic_write_text(path, json.dumps(result, indent=2) + "\n")
    print(f"\nResults: `{path.relative_to(HERE.parent)}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
