"""Generation speed: ``lmforge.generation.generate`` on our ``Decoder`` against ``transformers``'
``GPT2LMHeadModel.generate``, identical random weights.

A GPT-2-shaped decoder (default the ``gpt-mini`` preset: 6 layers, 192 wide, 6 heads, with GPT-2's 50,257-token
vocabulary; ``--shape gpt2-small`` for the real GPT-2 size) is initialised randomly and its weights are copied into
a ``GPT2LMHeadModel`` (attn_implementation="sdpa") with ``lmforge.interop.hf_gpt2``. Both sides get the same
prompts (``--prompt-len`` tokens; the batch of 8 is left-padded to lengths 8..prompt-len) and generate exactly
``--max-new-tokens`` tokens (no end-of-sequence id, so no row stops early): greedy and beam search with 4 beams
(length penalty none on our side, Hugging Face's default 1.0: equal lengths rank the same), batch 1 and 8, with and
without the key/value cache. The tokens of both sides are compared. The two sides alternate (the order flips every
repeat) and the median wall time is reported as new tokens per second (batch x max_new_tokens / time: the tokens
returned, not the beams explored).

Run: ``.venv/bin/python benchmarks/bench_generate.py [--quick] [--shape gpt-mini] [--threads 2] [--repeats 3]``.
Prints Markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common import fmt, fmt_ratio, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.config import model_config_from_preset
from lmforge.generation import generate
from lmforge.interop.hf_gpt2 import config_to_hf, state_dict_to_hf
from lmforge.models.decoder import Decoder

VOCAB = 50257
SHAPES = ("gpt-nano", "gpt-micro", "gpt-mini", "gpt2-small")


@dataclass
class Case:
    strategy: str  # "greedy" or "beam"
    batch: int
    cache: bool

    @property
    def beams(self) -> int:
        return 4 if self.strategy == "beam" else 1

    @property
    def label(self) -> str:
        return f"{self.strategy}{' 4' if self.beams > 1 else ''}"


def build_models(shape: str) -> tuple[Decoder, torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = model_config_from_preset(shape, vocab_size=VOCAB, dropout=0.0, attention_dropout=0.0, kernel="sdpa")
    ours = Decoder(config).eval()
    hf = GPT2LMHeadModel(GPT2Config(**config_to_hf(config), attn_implementation="sdpa")).eval()
    missing, unexpected = hf.load_state_dict(state_dict_to_hf(ours.state_dict(), config), strict=False)
    if missing or unexpected:
        raise AssertionError(f"weights do not map: missing {missing}, unexpected {unexpected}")
    return ours, hf


def make_prompts(batch: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random prompts; in a batch, row i > 0 is left-padded to a length spread over 8..length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(1, batch):
        real = 8 + (length - 8) * (batch - 1 - row) // max(batch - 1, 1)
        mask[row, :length - real] = 0
    return ids.masked_fill(mask == 0, 0), mask


def run_ours(model: Decoder, ids: torch.Tensor, mask: torch.Tensor, case: Case, n: int) -> list[list[int]]:
    options = dict(strategy="beam", num_beams=case.beams) if case.beams > 1 else {}
    out = generate(model, ids, mask, max_new_tokens=n, use_cache=case.cache, **options)
    return [hyps[0] for hyps in out.sequences]


def run_hf(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, case: Case, n: int) -> list[list[int]]:
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                         num_beams=case.beams, use_cache=case.cache, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def time_pair(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds of each function, calls interleaved (the order flips every repeat).

    CPU time is this process's (``time.process_time``): with one intra-op thread it is the work done, nearly
    unaffected by other jobs competing for the cores, which inflate wall time.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            wall, cpu = time.perf_counter(), time.process_time()
            fns[name]()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
            for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="gpt-nano, 8 new tokens, 1 repeat (a smoke test)")
    p.add_argument("--shape", choices=SHAPES, default=None, help="model shape (default gpt-mini)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 32 (8 with --quick)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats per side and case (default 5; at most 3 without the cache; 1 with --quick)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    args = p.parse_args(argv)
    shape = args.shape or ("gpt-nano" if args.quick else "gpt-mini")
    n = args.max_new_tokens or (8 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 5)
    torch.set_num_threads(args.threads)
    machine = machine_description()
    warnings.filterwarnings("ignore", module="transformers")
    print(f"{shape}: building and converting...", file=sys.stderr, flush=True)
    ours, hf = build_models(shape)

    rows = []
    with torch.inference_mode():
        for case in [Case(s, b, c) for s in ("greedy", "beam") for b in (1, 8) for c in (True, False)]:
            print(f"  {case.label}, batch {case.batch}, cache {case.cache}...", file=sys.stderr, flush=True)
            ids, mask = make_prompts(case.batch, args.prompt_len)
            a, b = run_ours(ours, ids, mask, case, n), run_hf(hf, ids, mask, case, n)
            same = sum(x == y for x, y in zip(a, b, strict=True))
            t = time_pair({"ours": lambda ids=ids, mask=mask, case=case: run_ours(ours, ids, mask, case, n),
                           "hf": lambda ids=ids, mask=mask, case=case: run_hf(hf, ids, mask, case, n)},
                          repeats if case.cache else min(repeats, 3))
            tokens = case.batch * n
            (wall_ours, cpu_ours), (wall_hf, cpu_hf) = t["ours"], t["hf"]
            rows.append([case.label, case.batch, "on" if case.cache else "off", fmt(tokens / wall_ours, 1),
                         fmt(tokens / wall_hf, 1), fmt_ratio(wall_hf / wall_ours), fmt(tokens / cpu_ours, 1),
                         fmt(tokens / cpu_hf, 1), fmt_ratio(cpu_hf / cpu_ours), f"{same}/{case.batch}"])

    cmd_args = list(argv if argv is not None else sys.argv[1:])
    cfg = ours.config
    print("# Generation speed: lmforge vs Hugging Face transformers\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{reproduce_command(__file__, cmd_args)}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    print(f"- torch threads: {torch.get_num_threads()}\n")
    print(f"Model: {shape} shape ({cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, vocabulary "
          f"{VOCAB:,}), random weights, identical on both sides (converted with `lmforge.interop.hf_gpt2`); "
          f"fp32, eval mode, `torch.inference_mode()`. Prompts of {args.prompt_len} tokens (batch 8: left-padded, "
          f"lengths 8..{args.prompt_len}); exactly {n} new tokens per row (no end-of-sequence id). lmforge "
          "`generate` vs `GPT2LMHeadModel.generate` (attn_implementation=\"sdpa\"); median of "
          f"{repeats} interleaved repeats ({min(repeats, 3)} without the cache) after one warm-up. Tokens/s = batch "
          "x new tokens / time, by wall time and by this process's CPU time (the work done, nearly independent "
          "of other jobs on the machine when torch runs one thread; with more threads idle OpenMP workers spin "
          "and inflate it). Ratio = Hugging Face time / ours (above 1: lmforge is faster). \"Same tokens\" = "
          "rows whose best hypothesis is identical on both sides.\n")
    print(markdown_table(["Search", "Batch", "KV cache", "lmforge tok/s", "HF tok/s", "HF / lmforge",
                          "lmforge tok/CPU-s", "HF tok/CPU-s", "HF / lmforge (CPU)", "Same tokens"],
                         rows, "lrlrrrrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
