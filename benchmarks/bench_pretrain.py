"""Pretraining throughput: lmforge against Hugging Face transformers, same shapes, same batches, one process.

Cases (issue 4), all at length 128, in train mode with dropout 0.1 on both sides:

- ``bert-mini`` (4 layers, 256 wide, 4 heads, d_ff 1024, vocabulary 30,522), batch 32, and ``bert-base``
  (12, 768, 12, 3072), batch 8: BERT MLM + NSP. Ours is ``TaskModel(Encoder, pretraining head)`` with
  ``MaskedLMObjective(nsp=True)`` (vocabulary projection at the masked positions only); theirs is
  ``transformers.BertForPreTraining`` (attn_implementation="sdpa"; projection at every position). Batches: seeded
  random ids, [CLS] A [SEP] B [SEP] with a random segment boundary, 19 masked positions per sequence (15%; labels
  -100 elsewhere), NSP labels 50/50.
- ``gpt`` (gpt-mini: 6 layers, 192 wide, 6 heads, vocabulary 50,257), batch 16: causal LM. Ours is ``Decoder`` with
  ``CausalLMObjective`` (labels = next tokens, -100 at the last position); theirs is ``transformers.GPT2LMHeadModel``
  with ``labels=input_ids`` (shifted inside). Both predict B x 127 tokens. ``gpt2-small`` (12 layers, 768 wide, 12
  heads, vocabulary 50,257), batch 8: the same at GPT-2 small's shape.

One step = forward + loss (inside ``torch.autocast("cpu", torch.bfloat16)`` for bf16) + backward +
``torch.optim.AdamW(lr=1e-4)`` step (torch's defaults) + ``zero_grad()``. After warm-up steps, the two sides run in
alternating blocks of steps (the order flips every block) and the median block's time per step is reported.

FLOPs are the matmul FLOPs each side actually executes: 6 x (weights of every matmul, counted at the positions
where it is applied) x tokens, plus the attention term 12 x layers x length x width per token (QK^T and AV,
forward and backward); embedding look-ups, norms, activations and the optimizer count 0. The tied vocabulary
matrix counts once per projected position: every position for Hugging Face, the masked ones for our MLM; our
BERT's last layer counts its queries, output projection, feed-forward and attention at the positions it computes (the
masked ones and [CLS], ``Encoder(read_rows=...)``), its keys and values at every position. MFU is
achieved FLOP/s over the matmul peak this script measures at start and again at end (the better reading of each:
best of repeated 2048^3 ``F.linear`` products, same thread count, fp32 or bf16).

With ``--precision both`` (the default) bf16 runs only when the measured bf16 matmul peak beats fp32: on a CPU
without native bf16 arithmetic (no AVX512_BF16 or AMX) autocast makes training many times slower, and the table says
so instead. ``--precision bf16`` forces it.

Run: ``.venv/bin/python benchmarks/bench_pretrain.py [--quick] [--steps 12] [--only bert-mini|bert-base|gpt|gpt2-small]
[--precision fp32|bf16|both]``. Prints Markdown; the allocator of the run (glibc or a preloaded tcmalloc) applies to
both sides alike.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common import (
    allocator,
    fmt,
    fmt_ratio,
    machine_description,
    markdown_table,
    print_machine,
    reproduce_command,
)
from lmforge.config import ModelConfig, model_config_from_preset
from lmforge.heads import TaskModel, build_head
from lmforge.models.decoder import Decoder
from lmforge.models.encoder import Encoder
from lmforge.objectives import CausalLMObjective, MaskedLMObjective

LENGTH = 128
MASKED_PER_SEQ = 19  # 15% of 128, rounded
CLS, SEP, MASK = 101, 102, 103  # BERT's special ids (the random ids are drawn above them)
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
TARGETS = {("bert-mini", "fp32"): 2.0, ("bert-base", "fp32"): 1.2}  # ours / HF tokens/s, issue 4


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str  # "bert" or "gpt"
    preset: str
    batch: int
    vocab: int


SHAPES = {
    "bert-mini": Shape("bert-mini", "bert", "bert-mini", 32, 30522),
    "bert-base": Shape("bert-base", "bert", "bert-base", 8, 30522),
    "gpt": Shape("gpt", "gpt", "gpt-mini", 16, 50257),
    "gpt2-small": Shape("gpt2-small", "gpt", "gpt2-small", 8, 50257),
}


# ---------------------------------------------------------------------------------------------- peak
def linear_gflops(dtype: torch.dtype, n: int, repeats: int) -> float:
    """Best GFLOP/s of ``F.linear`` (what ``nn.Linear`` runs) on (n x n) matrices in ``dtype``, current threads."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    F.linear(a, b)
    fastest = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        F.linear(a, b)
        fastest = min(fastest, time.perf_counter() - start)
    return 2 * n**3 / fastest / 1e9


def matmul_peak() -> dict[str, tuple[float, int]]:
    """The matmul ceiling: ``{"fp32" | "bf16": (GFLOP/s, matrix size)}``.

    fp32 is the best of 8 products at 2048^3. bf16 is probed at 512^3 first: a CPU without native bf16 arithmetic
    runs it at a few GFLOP/s, and the probe's figure is kept instead of spending minutes at 2048^3.
    """
    fp32 = linear_gflops(torch.float32, 2048, 8)
    probe = linear_gflops(torch.bfloat16, 512, 3)
    if probe < fp32 / 2:
        return {"fp32": (fp32, 2048), "bf16": (probe, 512)}
    return {"fp32": (fp32, 2048), "bf16": (max(probe, linear_gflops(torch.bfloat16, 2048, 8)), 2048)}


# ---------------------------------------------------------------------------------------------- batches
def bert_batch(batch: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """[CLS] A [SEP] B [SEP], 19 [MASK]ed non-special positions per row; the keys our objective reads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, LENGTH), generator=g)
    boundary = torch.randint(LENGTH // 4, 3 * LENGTH // 4, (batch,), generator=g)  # index of the first [SEP]
    pos = torch.arange(LENGTH)
    token_type_ids = (pos[None, :] > boundary[:, None]).long()
    ids[:, 0] = CLS
    ids[torch.arange(batch), boundary] = SEP
    ids[:, -1] = SEP
    special = (pos[None, :] == 0) | (pos[None, :] == boundary[:, None]) | (pos[None, :] == LENGTH - 1)
    scores = torch.rand(batch, LENGTH, generator=g).masked_fill(special, 2.0)  # specials are never picked
    picked = scores.argsort(dim=1)[:, :MASKED_PER_SEQ]
    masked = torch.zeros(batch, LENGTH, dtype=torch.bool).scatter_(1, picked, True)
    mlm_labels = ids.masked_fill(~masked, -100)
    input_ids = ids.masked_fill(masked, MASK)
    nsp_labels = torch.randint(0, 2, (batch,), generator=g)
    return dict(input_ids=input_ids, attention_mask=torch.ones(batch, LENGTH, dtype=torch.long),
                token_type_ids=token_type_ids, mlm_labels=mlm_labels, nsp_labels=nsp_labels)


def gpt_batch(batch: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids; ``labels`` are the next tokens (-100 at the last position, which has none)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, LENGTH), generator=g)
    labels = torch.full_like(ids, -100)
    labels[:, :-1] = ids[:, 1:]
    return dict(input_ids=ids, labels=labels, attention_mask=torch.ones(batch, LENGTH, dtype=torch.long))


# ---------------------------------------------------------------------------------------------- models
def our_config(shape: Shape) -> ModelConfig:
    return model_config_from_preset(shape.preset, vocab_size=shape.vocab, max_seq_len=LENGTH, dropout=0.1)


def build_bert(shape: Shape) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import BertConfig, BertForPreTraining

    cfg = our_config(shape)
    torch.manual_seed(0)
    encoder = Encoder(cfg)
    ours = TaskModel(encoder, build_head({"type": "pretraining"}, cfg, encoder))
    hf_cfg = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                        num_attention_heads=cfg.n_heads, intermediate_size=cfg.d_ff, max_position_embeddings=LENGTH,
                        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attention_dropout,
                        type_vocab_size=cfg.type_vocab_size, layer_norm_eps=cfg.layer_norm_eps,
                        attn_implementation="sdpa")
    torch.manual_seed(0)
    return ours.train(), BertForPreTraining(hf_cfg).train()


def build_gpt(shape: Shape) -> tuple[torch.nn.Module, torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = our_config(shape)
    torch.manual_seed(0)
    ours = Decoder(cfg)
    hf_cfg = GPT2Config(vocab_size=cfg.vocab_size, n_positions=LENGTH, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                        n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function="gelu_new",
                        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention_dropout,
                        layer_norm_epsilon=cfg.layer_norm_eps, attn_implementation="sdpa")
    torch.manual_seed(0)
    return ours.train(), GPT2LMHeadModel(hf_cfg).train()


def param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights once


def step_flops(cfg: ModelConfig, kind: str, batch: int, projected: int, last_rows: int | None = None) -> float:
    """Executed matmul FLOPs of one training step (see the module docstring); ``projected`` = positions that go
    through the vocabulary projection; ``last_rows``: positions the last layer computes (its queries, output
    projection and feed-forward; keys and values at every position), None = every position."""
    D, F, L, V = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size
    tokens = batch * LENGTH
    assert F is not None
    rows = tokens if last_rows is None else last_rows
    per_position = 6 * (4 * D * D + 2 * D * F) + 12 * LENGTH * D  # one layer's weights and attention, one position
    body = (L - 1) * per_position * tokens + 6 * (2 * D * D) * tokens \
        + (6 * (2 * D * D + 2 * D * F) + 12 * LENGTH * D) * rows
    if kind == "bert":  # MLM transform (D x D) and projection at `projected` positions; pooler and NSP per row
        head = 6 * (D * D + V * D) * projected + 6 * (D * D + 2 * D) * batch
    else:
        head = 6 * V * D * projected
    return float(body + head)


# ---------------------------------------------------------------------------------------------- steps
def autocast(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def make_steps(shape: Shape, ours: torch.nn.Module, hf: torch.nn.Module, batch: dict[str, torch.Tensor],
               precision: str) -> dict[str, Callable[[], torch.Tensor]]:
    """One training step of each side, returning its (detached) loss."""
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    objective = MaskedLMObjective(nsp=True) if shape.kind == "bert" else CausalLMObjective()

    def step_ours() -> torch.Tensor:
        with autocast(precision):
            out = objective(ours, batch)
            loss = sum(total / count for total, count in out.losses.values())
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad()
        return loss.detach()

    if shape.kind == "bert":
        def hf_forward() -> torch.Tensor:
            return hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"], labels=batch["mlm_labels"],
                      next_sentence_label=batch["nsp_labels"]).loss
    else:
        def hf_forward() -> torch.Tensor:
            return hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      labels=batch["input_ids"]).loss

    def step_hf() -> torch.Tensor:
        with autocast(precision):
            loss = hf_forward()
        loss.backward()
        opt_hf.step()
        opt_hf.zero_grad()
        return loss.detach()

    return {"lmforge": step_ours, "HF": step_hf}


def time_interleaved(steps: dict[str, Callable[[], torch.Tensor]], n_steps: int, block: int,
                     warmup: int) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Seconds per step of each block, the sides alternating block by block (the order flips every block), and
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
    for b in range(max(1, math.ceil(n_steps / block))):
        for name in names if b % 2 == 0 else reversed(names):
            start = time.perf_counter()
            for _ in range(block):
                steps[name]()
            times[name].append((time.perf_counter() - start) / block)
    return times, first


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="bert-mini only, 4 timed steps per side (a smoke test)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per side and case (default 12; 4 with "
                                                           "--quick), in blocks of --block")
    p.add_argument("--block", type=int, default=None, help="steps per timed block (default 2; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per side first (default 3; 1 with "
                                                            "--quick)")
    p.add_argument("--only", choices=list(SHAPES), help="one case only")
    p.add_argument("--precision", choices=["fp32", "bf16", "both"], default="both")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    args = p.parse_args(argv)
    steps = args.steps or (4 if args.quick else 12)
    block = args.block or (1 if args.quick else 2)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if steps < 1 or block < 1 or warmup < 1:
        p.error("--steps, --block and --warmup must be >= 1")
    shapes = [args.only] if args.only else (["bert-mini"] if args.quick else list(SHAPES))
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    machine = machine_description()

    print("measuring the matmul peak...", file=sys.stderr, flush=True)
    at_start = matmul_peak()
    peak = {k: v[0] for k, v in at_start.items()}
    skipped = []
    if args.precision == "both" and peak["bf16"] < peak["fp32"]:
        precisions = ["fp32"]
        skipped.append(f"bf16 not run: this CPU's bf16 matmul peak ({peak['bf16']:.1f} GFLOP/s) is below fp32 "
                       f"({peak['fp32']:.0f} GFLOP/s), so autocast would only slow training down (no native bf16 "
                       "arithmetic); pass --precision bf16 to measure it anyway")

    results, ratios, notes = [], {}, []
    for name in shapes:
        shape = SHAPES[name]
        print(f"{name}: building...", file=sys.stderr, flush=True)
        ours, hf = (build_bert if shape.kind == "bert" else build_gpt)(shape)
        n_ours, n_hf = param_count(ours), param_count(hf)
        if n_ours != n_hf:
            raise AssertionError(f"{name}: parameter counts differ: lmforge {n_ours:,}, HF {n_hf:,}")
        cfg = our_config(shape)
        batch = (bert_batch if shape.kind == "bert" else gpt_batch)(shape.batch, shape.vocab)
        if shape.kind == "bert":
            read = batch["mlm_labels"] != -100
            predicted = int(read.sum())
            read[:, 0] = True  # the last layer computes the masked positions and [CLS] (NSP)
            flops = {"lmforge": step_flops(cfg, "bert", shape.batch, predicted, int(read.sum())),
                     "HF": step_flops(cfg, "bert", shape.batch, shape.batch * LENGTH)}
        else:
            predicted = int((batch["labels"] != -100).sum())  # HF: B x (T - 1) after its internal shift
            if predicted != shape.batch * (LENGTH - 1):
                raise AssertionError(f"{name}: {predicted} predicted tokens, expected {shape.batch * (LENGTH - 1)}")
            flops = {side: step_flops(cfg, "gpt", shape.batch, shape.batch * LENGTH) for side in ("lmforge", "HF")}
        notes.append(f"{name}: {n_ours:,} parameters on each side, batch {shape.batch} x {LENGTH}, {predicted:,} "
                     f"predicted tokens per step on each side")
        for precision in precisions:
            print(f"  {precision}: {warmup} warm-up + {steps} timed steps per side...", file=sys.stderr, flush=True)
            fns = make_steps(shape, ours, hf, batch, precision)
            wall = time.perf_counter()
            times, first = time_interleaved(fns, steps, block, warmup)
            chance = math.log(shape.vocab) + (math.log(2) if shape.kind == "bert" else 0.0)
            notes.append(f"{name} {precision}: first-step loss lmforge {first['lmforge']:.3f}, HF {first['HF']:.3f} "
                         f"(chance level {chance:.3f})")
            wall = time.perf_counter() - wall
            load = os.getloadavg()[0]
            med = {side: statistics.median(t) for side, t in times.items()}
            ratio = med["HF"] / med["lmforge"]
            ratios[(name, precision)] = ratio
            for side in ("lmforge", "HF"):
                results.append((name, precision, side, shape.batch, times[side], med[side], flops[side],
                                ratio if side == "lmforge" else None, load))
            print(f"    {wall:.0f} s; lmforge {med['lmforge'] * 1e3:.0f} ms, HF {med['HF'] * 1e3:.0f} ms per step",
                  file=sys.stderr, flush=True)
        del ours, hf

    # The machine is shared: measure the ceiling again and keep the better reading of each precision.
    print("measuring the matmul peak again...", file=sys.stderr, flush=True)
    at_end = matmul_peak()
    peak = {k: max(at_start[k][0], at_end[k][0]) for k in at_start}
    rows = []
    for name, precision, side, batch_size, t, med_t, f, ratio, load in results:
        gflops = f / med_t / 1e9
        rows.append([name, precision, side, fmt(med_t * 1e3, 0), f"{min(t) * 1e3:,.0f}–{max(t) * 1e3:,.0f}",
                     fmt(batch_size * LENGTH / med_t, 0), fmt_ratio(ratio) if ratio else "", fmt(f / 1e9, 1),
                     fmt(gflops, 1), f"{100 * gflops / peak[precision]:.0f}%", f"{load:.2f}"])

    cmd_args = list(argv if argv is not None else sys.argv[1:])
    preload = os.environ.get("LD_PRELOAD", "")
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    command = reproduce_command(__file__, cmd_args)
    if preload:
        command = f"LD_PRELOAD={preload} {command}"
    if tunables:
        command = f"GLIBC_TUNABLES={tunables} {command}"
    print("# Pretraining throughput: lmforge vs Hugging Face transformers\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{command}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    print(f"- torch threads: {torch.get_num_threads()}")
    print(f"- Matmul peak (`F.linear`, best of repeated n^3 products, {torch.get_num_threads()} threads; at start / "
          "at end; MFU uses the better): "
          + ", ".join(f"{k} {at_start[k][0]:.1f} / {at_end[k][0]:.1f} GFLOP/s (n = {at_start[k][1]})"
                      for k in at_start))
    print(f"- Allocator (both sides, one process): {allocator()}"
          + (f", GLIBC_TUNABLES={tunables}" if tunables else "")
          + ("" if "tcmalloc" in preload or os.path.exists(TCMALLOC) else f"; {TCMALLOC} is not installed here"))
    print(f"- Load average (1, 5, 15 min) at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(f"Training steps (forward + loss + backward + AdamW + zero_grad), train mode, dropout 0.1, length {LENGTH}; "
          f"{warmup} warm-up steps per side, then {steps} timed steps per side in alternating blocks of {block} "
          "(the order flips every block); \"step ms\" is the median block's time per step, \"blocks\" the fastest "
          "and slowest block. bf16 = `torch.autocast(\"cpu\", dtype=torch.bfloat16)` around forward and loss. "
          "Tokens/s = batch x length / step time; ours/HF = HF step time / ours (above 1: lmforge is faster). "
          "GFLOP/step counts the matmul FLOPs each side executes (6 x weights x positions where applied, plus "
          "attention; our MLM projects only the masked positions, so it does fewer FLOPs for the same tokens); "
          "MFU = achieved GFLOP/s / the measured peak of that precision. Load = 1-minute load average after the "
          "case.\n")
    for note in skipped + notes:
        print(f"- {note}")
    print()
    header = ["Model", "Precision", "Side", "step ms", "blocks ms", "tokens/s", "ours/HF", "GFLOP/step", "GFLOP/s",
              "MFU", "load"]
    print(markdown_table(header, rows, "lllrrrrrrrr"))
    print()
    for (name, precision), target in TARGETS.items():
        if (name, precision) in ratios:
            ratio = ratios[(name, precision)]
            verdict = "PASS" if ratio >= target else "MISS"
            print(f"{verdict}: {name} {precision} lmforge/HF tokens/s = {ratio:.2f}x (target >= {target}x)")
        else:
            print(f"NOT RUN: {name} {precision} (target >= {target}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
