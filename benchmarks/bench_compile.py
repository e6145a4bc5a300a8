"""``--compile`` measured: lmforge with and without torch.compile, side by side in one process (issue 22, item 6).

Cases (bert-mini: 4 layers, 256 wide, 4 heads, d_ff 1024, vocabulary 30,522; fp32; length 128):

- ``pretrain``: BERT MLM + NSP training steps (``TaskModel(Encoder, pretraining head)``,
  ``MaskedLMObjective(nsp=True)``, dropout 0.1), batch 32 as in ``bench_pretrain.py``: forward + loss + backward +
  AdamW step + zero_grad. The compiled side is what the Trainer runs under ``--compile``:
  ``lmforge.utils.compiling.compile_module`` (inductor, automatic dynamic shapes, dropout on eager's random
  stream). Both sides start from the same weights, each with its own AdamW.
- ``inference``: encoder forward passes in eval mode without gradients, batch 32, padded batches whose lengths are
  drawn from 16..128 (a different longest length per batch, so the shapes vary as in ``lmforge predict``); the
  compiled side is compiled in place as ``predict`` / ``embed`` / ``serve --compile`` do. Outputs are checked to
  match on the real tokens.

Compile time is reported on its own: the warm-up steps of each side are timed, and the compiled side's extra time
over the eager side's is the cost of compiling (including the recompile that makes the length dimension dynamic).
Then the two sides run in alternating blocks (the order flips every block); each block gives seconds per step, and
the table shows the median with the spread (min..max) over blocks and the ratio eager / compiled per block pair.
By default the inductor cache is a fresh folder (a cold compile, what a first run costs); ``--warm-cache`` keeps
torch's own cache. The machine's load average is printed at the start and the end: other jobs on the machine make
the numbers noisier, and they are reported as measured.

Run: ``.venv/bin/python benchmarks/bench_compile.py [--quick] [--only pretrain|inference] [--blocks 4] [--block 2]
[--threads 2] [--json benchmarks/results/compile.json] [--md benchmarks/results/compile.md]``. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._dynamo

from common import fmt, machine_description, markdown_table, reproduce_command

LENGTH = 128
VOCAB = 30522


def cpu_flags() -> str:
    """The instruction-set extensions that matter for these kernels, as /proc/cpuinfo reports them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return "unknown"
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]
    present = [name for name in wanted if name in flags]
    return " ".join(present) if present else "none of " + " ".join(wanted)


def load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# ---------------------------------------------------------------------------------------------- cases
def pretrain_case(batch_size: int) -> tuple[dict[str, Callable[[], object]], str]:
    from bench_pretrain import bert_batch
    from lmforge.config import model_config_from_preset
    from lmforge.heads import TaskModel, build_head
    from lmforge.models.encoder import Encoder
    from lmforge.objectives import MaskedLMObjective
    from lmforge.utils.compiling import compile_module

    cfg = model_config_from_preset("bert-mini", vocab_size=VOCAB, max_seq_len=LENGTH, dropout=0.1)

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        encoder = Encoder(cfg)
        return TaskModel(encoder, build_head({"type": "pretraining"}, cfg, encoder)).train()

    batch = bert_batch(batch_size, VOCAB)
    objective = MaskedLMObjective(nsp=True)

    def make_step(model: torch.nn.Module, called: torch.nn.Module) -> Callable[[], object]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> float:
            out = objective(called, batch)
            loss = sum(total / count for total, count in out.losses.values())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss.detach())
        return step

    eager, compiled = build(), build()
    steps = {"eager": make_step(eager, eager), "compiled": make_step(compiled, compile_module(compiled, "cpu"))}
    return steps, f"bert-mini MLM+NSP training step, batch {batch_size} x {LENGTH}, fp32, dropout 0.1"


def inference_case(batch_size: int, n_batches: int) -> tuple[dict[str, Callable[[], object]], str]:
    from lmforge.config import model_config_from_preset
    from lmforge.models.encoder import Encoder
    from lmforge.utils.compiling import compile_in_place

    cfg = model_config_from_preset("bert-mini", vocab_size=VOCAB, max_seq_len=LENGTH)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(n_batches):
        lengths = torch.randint(16, LENGTH + 1, (batch_size,), generator=g)
        width = int(lengths.max())
        mask = (torch.arange(width) < lengths[:, None]).long()
        ids = torch.randint(1000, VOCAB, (batch_size, width), generator=g).masked_fill(mask == 0, 0)
        batches.append((ids, mask))
    torch.manual_seed(0)
    eager = Encoder(cfg).eval()
    torch.manual_seed(0)
    compiled = compile_in_place(Encoder(cfg).eval())
    with torch.no_grad():  # the same function: equal on the real tokens
        ids, mask = batches[0]
        a, b = eager(ids, attention_mask=mask).last_hidden_state, compiled(ids, attention_mask=mask).last_hidden_state
        diff = float((a - b).abs()[mask.bool()].max())
    if diff > 1e-3:
        raise AssertionError(f"compiled and eager encoders differ by {diff:.2e} on the real tokens")

    def make_step(model: torch.nn.Module) -> Callable[[], object]:
        def run() -> None:  # one pass over the batches; the time per batch is the block time / n_batches
            with torch.no_grad():
                for ids, mask in batches:
                    model(ids, attention_mask=mask)
        return run

    lengths = [int(ids.shape[1]) for ids, _ in batches]
    label = (f"bert-mini encoder forward, eval, no grad, batch {batch_size}, padded lengths 16..{LENGTH} "
             f"({n_batches} batches of longest length {min(lengths)}..{max(lengths)}; max |diff| {diff:.1e})")
    return {"eager": make_step(eager), "compiled": make_step(compiled)}, label


# ---------------------------------------------------------------------------------------------- timing
def measure(steps: dict[str, Callable[[], object]], *, warmup: int, blocks: int, block: int,
            per_call: int = 1) -> dict[str, object]:
    """Warm-up times per side (compiled side: compilation), then alternating timed blocks (seconds per step)."""
    warm: dict[str, list[float]] = {}
    graphs_before = graphs_compiled()
    for name in ("eager", "compiled"):
        times = []
        for _ in range(warmup):
            start = time.perf_counter()
            steps[name]()
            times.append(time.perf_counter() - start)
            print(f"    {name} warm-up: {times[-1]:.2f} s", file=sys.stderr, flush=True)
        warm[name] = times
    graphs_after_warmup = graphs_compiled()
    per_step: dict[str, list[float]] = {"eager": [], "compiled": []}
    for b in range(blocks):
        for name in ("eager", "compiled") if b % 2 == 0 else ("compiled", "eager"):
            start = time.perf_counter()
            for _ in range(block):
                steps[name]()
            per_step[name].append((time.perf_counter() - start) / (block * per_call))
        print(f"    block {b + 1}/{blocks}: eager {per_step['eager'][-1]:.3f} s, compiled "
              f"{per_step['compiled'][-1]:.3f} s", file=sys.stderr, flush=True)
    ratios = [e / c for e, c in zip(per_step["eager"], per_step["compiled"], strict=True)]
    eager_step = statistics.median(per_step["eager"]) * per_call
    return {
        "warmup_s": warm,
        # compilation: the compiled side's warm-up beyond what the same calls cost eagerly (steady-state eager time)
        "compile_s": sum(warm["compiled"]) - warmup * eager_step,
        "graphs_compiled_in_warmup": graphs_after_warmup - graphs_before,
        "graphs_compiled_while_timed": graphs_compiled() - graphs_after_warmup,
        "per_step_s": per_step,
        "ratio_per_block": ratios,
        "ratio_median": statistics.median(ratios),
    }


def spread(values: list[float], digits: int = 3) -> str:
    return f"{fmt(statistics.median(values), digits)} ({fmt(min(values), digits)}..{fmt(max(values), digits)})"


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batch 8, 2 blocks of 1 step (a smoke test)")
    p.add_argument("--only", choices=["pretrain", "inference"], help="one case only")
    p.add_argument("--blocks", type=int, default=None, help="timed blocks per side (default 4; 2 with --quick)")
    p.add_argument("--block", type=int, default=None, help="steps per block (default 2; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per side first (default 3: the compiled "
                   "side compiles, then recompiles once with a dynamic length)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    p.add_argument("--warm-cache", action="store_true", help="use torch's inductor cache (default: a fresh folder, "
                   "a cold compile)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--md", metavar="FILE", help="also write the Markdown section")
    args = p.parse_args(argv)
    blocks = args.blocks or (2 if args.quick else 4)
    block = args.block or (1 if args.quick else 2)
    if blocks < 1 or block < 1 or args.warmup < 1:
        p.error("--blocks, --block and --warmup must be >= 1")
    batch = 8 if args.quick else 32
    torch.set_num_threads(args.threads)
    cache = None
    if not args.warm_cache:
        cache = tempfile.mkdtemp(prefix="lmforge-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    from lmforge.utils.compiling import check_compile, compile_backend

    check_compile("cpu")
    machine = machine_description()
    machine["CPU flags"] = cpu_flags()
    machine["torch threads"] = str(torch.get_num_threads())
    machine["Backend"] = f"{compile_backend()} ({'fresh cache: cold compile' if cache else 'warm cache allowed'})"
    command = reproduce_command(__file__, argv if argv is not None else sys.argv[1:])

    cases = [args.only] if args.only else ["pretrain", "inference"]
    results: dict[str, dict] = {}
    try:
        for name in cases:
            print(f"{name}: building...", file=sys.stderr, flush=True)
            torch._dynamo.reset()
            if name == "pretrain":
                steps, label = pretrain_case(batch)
                per_call = 1
            else:
                n_batches = 4 if args.quick else 8
                steps, label = inference_case(batch, n_batches)
                per_call = n_batches
            wall = time.perf_counter()
            result = measure(steps, warmup=args.warmup, blocks=blocks, block=block, per_call=per_call)
            result.update(label=label, wall_s=time.perf_counter() - wall, load_after=load_average())
            results[name] = result
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    load_end = load_average()

    unit = {"pretrain": "s per training step", "inference": "s per batch of 32" if batch == 32 else "s per batch"}
    rows = []
    for name, r in results.items():
        ratios = r["ratio_per_block"]
        rows.append([name, unit[name], spread(r["per_step_s"]["eager"]), spread(r["per_step_s"]["compiled"]),
                     f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}..{max(ratios):.2f})",
                     fmt(r["compile_s"], 1), f"{r['graphs_compiled_in_warmup']} / {r['graphs_compiled_while_timed']}"])
    header = ["case", "unit", "eager: median (min..max)", "--compile: median (min..max)",
              "speed-up eager/compiled per block", "compile time (s)", "graphs compiled: warm-up / timed"]
    table = markdown_table(header, rows)
    lines = ["## `--compile` (torch.compile) with and without", "",
             f"Reproduce: `{command}`", "", table, ""]
    lines += [f"- {name}: {r['label']}; {args.warmup} warm-up steps per side (eager "
              f"{', '.join(f'{t:.2f}' for t in r['warmup_s']['eager'])} s; compiled "
              f"{', '.join(f'{t:.2f}' for t in r['warmup_s']['compiled'])} s), then {blocks} blocks of {block} per side"
              f"; {r['wall_s']:.0f} s in all" for name, r in results.items()]
    lines += ["- speed-up > 1: --compile is faster; spread is over the blocks, whose order alternates",
              "- compile time: the compiled side's warm-up minus the same number of steady eager steps; graphs "
              "compiled counts TorchDynamo's graphs (graph breaks at lmforge's input checks and at unpadding's "
              "data-dependent shapes split the model into several)",
              f"- load average (1, 5, 15 min): start {machine['Load average (1, 5, 15 min) at start']}, end {load_end}"
              " (the machine has other jobs: the numbers are as measured)", "", "Machine:", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.json:
        payload = {"command": command, "machine": machine, "load_end": load_end, "warmup": args.warmup,
                   "blocks": blocks, "block": block, "batch": batch, "results": results}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=float) + "\n", encoding="utf-8")
    if args.md:
        Path(args.md).write_text(text, encoding="utf-8")
    if any(not math.isfinite(r["ratio_median"]) for r in results.values()):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
