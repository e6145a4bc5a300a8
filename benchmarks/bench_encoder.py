"""BERT encoder forward latency: lmforge's ``Encoder`` against ``transformers.BertModel``, same weights.

For each shape (bert-mini: 4 layers, 256 wide, 4 heads; MiniLM: 6, 384, 12; bert-base: 12 layers, 768 wide, 12
heads; vocabulary 30,522) a randomly initialised ``BertModel`` (attn_implementation="sdpa") is converted to our
``Encoder`` (sdpa kernel) with ``lmforge.interop.hf_bert``, so both compute the same function; outputs are checked to
match on the real tokens. Each case times eval-mode, no-grad, fp32 forward passes at length 128: batch 1, batch 32,
and batch 32 with padding (lengths drawn from 32..128 and from 16..128, so the attention mask matters and lmforge
unpads; the padded cases also time lmforge with ``unpad = False``). The models alternate (the order flips every
repeat) and the median of the repeats is reported.

Run: ``.venv/bin/python benchmarks/bench_encoder.py [--quick] [--shapes minilm] [--repeats 7] [--threads 2]``.
Prints Markdown.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from common import fmt, fmt_ratio, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.interop.hf_bert import config_from_hf, state_dict_from_hf
from lmforge.models.encoder import Encoder

SHAPES = {  # name -> (layers, width, heads)
    "bert-mini": (4, 256, 4),
    "minilm": (6, 384, 12),  # MiniLM-L6-H384, the pretrained model the tests and demo read
    "bert-base": (12, 768, 12),
}
VOCAB = 30522
LENGTH = 128
MAX_DIFF = 1e-4  # fp32, same weights; the observed differences are ~1e-6


@dataclass
class Case:
    shape: str
    batch: int
    padded: int = 0  # the shortest length of a padded batch (lengths uniform in padded..128); 0: no padding

    @property
    def label(self) -> str:
        return f"{self.batch}" + (f" (padded {self.padded}..{LENGTH})" if self.padded else "")


def make_inputs(case: Case, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, VOCAB, (case.batch, LENGTH), generator=g)
    mask = torch.ones(case.batch, LENGTH, dtype=torch.long)
    if case.padded:
        lengths = torch.randint(case.padded, LENGTH + 1, (case.batch,), generator=g)
        lengths[0] = LENGTH
        mask = (torch.arange(LENGTH) < lengths[:, None]).long()
        ids = ids.masked_fill(mask == 0, 0)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))


def build_models(shape: str) -> tuple[torch.nn.Module, Encoder]:
    from transformers import BertConfig, BertModel

    layers, width, heads = SHAPES[shape]
    torch.manual_seed(0)
    hf_config = BertConfig(vocab_size=VOCAB, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                           intermediate_size=4 * width, attn_implementation="sdpa")
    hf = BertModel(hf_config).eval()
    config = config_from_hf(hf_config.to_dict())
    config.kernel = "sdpa"
    ours = Encoder(config)
    encoder_sd, _ = state_dict_from_hf(hf.state_dict())
    ours.load_state_dict(encoder_sd)
    return hf, ours.eval()


def time_pair(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds of each function, calls interleaved (the order flips every repeat)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else reversed(names):
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def run_case(hf: torch.nn.Module, ours: Encoder, case: Case, repeats: int) -> dict[str, float]:
    """Median seconds of ours, of ours without unpadding (padded cases), of the reference; and the output gap."""
    inputs = make_inputs(case)
    real = inputs["attention_mask"].bool()

    def padded_ours():
        ours.unpad = False
        try:
            return ours(**inputs)
        finally:
            ours.unpad = True

    with torch.inference_mode():
        diff = (ours(**inputs).last_hidden_state - hf(**inputs).last_hidden_state)[real].abs().max().item()
        if diff > MAX_DIFF:
            raise AssertionError(f"{case.shape} batch {case.label}: outputs differ by {diff:.2e} > {MAX_DIFF}")
        fns = {"ours": lambda: ours(**inputs), "hf": lambda: hf(**inputs)}
        if case.padded:
            fns["ours_padded"] = padded_ours
        t = time_pair(fns, repeats)
    return {**t, "diff": diff}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="bert-mini only, 3 repeats (a smoke test)")
    p.add_argument("--shapes", default=None, help=f"comma-separated subset of {', '.join(SHAPES)}")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per model and case (default 7; 3 "
                                                                "with --quick)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    args = p.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    torch.set_num_threads(args.threads)
    machine = machine_description()
    shapes = ["bert-mini"] if args.quick else (args.shapes.split(",") if args.shapes else list(SHAPES))

    rows = []
    for shape in shapes:
        print(f"{shape}: building and converting...", file=sys.stderr, flush=True)
        hf, ours = build_models(shape)
        for case in (Case(shape, 1), Case(shape, 32), Case(shape, 32, 32), Case(shape, 32, 16)):
            print(f"  batch {case.label}...", file=sys.stderr, flush=True)
            t = run_case(hf, ours, case, repeats)
            padded = t.get("ours_padded")
            rows.append([shape, case.label, fmt(t["ours"] * 1e3, 1),
                         fmt(padded * 1e3, 1) if padded else "-", fmt(t["hf"] * 1e3, 1),
                         fmt_ratio(t["hf"] / t["ours"]), fmt_ratio(padded / t["ours"]) if padded else "-",
                         f"{t['diff']:.1e}"])
        del hf, ours

    cmd_args = list(argv if argv is not None else sys.argv[1:])
    print("# BERT encoder forward latency: lmforge vs Hugging Face transformers\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{reproduce_command(__file__, cmd_args)}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    print(f"- torch threads: {torch.get_num_threads()}\n")
    print(f"Forward pass, eval mode, `torch.inference_mode()`, fp32, length {LENGTH}, vocabulary {VOCAB:,}; "
          f"median of {repeats} interleaved repeats after one warm-up. lmforge `Encoder` (kernel \"sdpa\") vs "
          "`transformers.BertModel` (attn_implementation=\"sdpa\"), the same random weights (converted with "
          "`lmforge.interop.hf_bert`); both run in this one process, with the same allocator. Ratio = reference "
          "time / ours (above 1: lmforge is faster).\n")
    print("Padded batches: lengths uniform in the range, one sequence of 128, so every batch is 128 wide; lmforge "
          "unpads them (the layers run on the real tokens, `lmforge.nn.packing`); \"no unpadding\" is the same "
          "model with `unpad = False`, timed in the same interleaved loop.\n")
    print(markdown_table(["Shape", "Batch", "lmforge ms", "lmforge, no unpadding ms", "HF ms", "HF / lmforge",
                          "unpadding speed-up", "max abs diff"], rows, "llrrrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
