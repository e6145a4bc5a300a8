"""MiniLMv2 against MiniLM (v1): the embedded MiniLM-L6 (12 heads) distilled into 3-layer students, v1's with the
teacher's 12 heads (last-layer attention and value relations, head by head) and v2's with 4 heads (query-query,
key-key and value-value relations over 12 relation heads, which need not match the student's), then fine-tuned on
BBC topics (issue 38, item 4).

Both students start from the same weights: teacher layers 0, 2, 4 without segment embedding and pooler (the v2
student is the same projections split into 4 heads of 96), both keep the hidden-state cosine (weight 1), both read
the same text for the same steps. Stages reuse ``bench_distill.py`` (its BBC split, distillation text and
fine-tuning settings); each is skipped when its result exists, so an interrupted run continues.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_minilm_v2.py --work runs/bench-minilm-v2 [--steps 300]

Prints Markdown and writes ``benchmarks/results/minilm-v2.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import bench_distill
from common import machine_description, markdown_table, print_machine, reproduce_command
from lmforge.cli import main as lmforge
from lmforge.data.corpora import minilm_dir
from lmforge.utils.io import atomic_write_text

HERE = Path(__file__).resolve().parent
VARIANTS = {
    "v1": ("MiniLM v1: 12 heads, attention + value relation", []),
    "v2": ("MiniLMv2: 4 heads, Q-Q / K-K / V-V relations", ["--model.n_heads=4", "--alpha-rel", "1", "--alpha-att",
                                                          "0", "--alpha-val", "0", "--relation-heads", "12"]),
}


def distill(work: Path, key: str, start: Path, shards: Path, args: argparse.Namespace) -> tuple[Path, float]:
    out = work / f"student-{key}"
    timing = work / f"{key}-seconds.json"
    if (out / "model.safetensors").is_file() and timing.is_file():
        return out, json.loads(timing.read_text())["seconds"]
    began = time.perf_counter()
    code = lmforge(["distill", "--teacher", str(minilm_dir()), "--student", str(start), "--input", str(shards),
                    "--out", str(out), "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
                    "--seq-len", "128", "--lr", str(args.lr), "--save-every", str(max(args.steps // 4, 1)),
                    "--resume", "auto", "--train.warmup_ratio=0.05", "--train.log_every=20",
                    "--data.eval_fraction=0.02", "--seed", "0", *VARIANTS[key][1]])
    if code:
        sys.exit(f"distill {key} failed ({code})")
    seconds = time.perf_counter() - began
    atomic_write_text(timing, json.dumps({"seconds": seconds}) + "\n")
    return out, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/bench-minilm-v2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--sizes", default="10,50")
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    teacher = minilm_dir()
    result_path = HERE / "results" / "minilm-v2.json"
    result: dict[str, Any] = {"machine": machine_description(), "command": reproduce_command(__file__, sys.argv[1:]),
                              "settings": vars(args)}
    shards = bench_distill.stage_data(work, teacher)
    start = bench_distill.stage_undistilled(work, teacher)  # teacher layers 0, 2, 4: both students' start
    sources = {}
    for key in VARIANTS:
        sources[key], seconds = distill(work, key, start, shards, args)
        records = [json.loads(line) for line in (sources[key] / "metrics.jsonl").read_text().splitlines()]
        result[f"{key}_seconds"] = seconds
        result[f"{key}_last_eval"] = next((r for r in reversed(records) if "eval_loss" in r), None)
        atomic_write_text(result_path, json.dumps(result, indent=2) + "\n")
    bench_distill.MODELS = tuple(VARIANTS)
    bench_distill.NAMES = {key: name for key, (name, _) in VARIANTS.items()}
    result["bbc"] = bench_distill.stage_bbc(work, sources, args)
    atomic_write_text(result_path, json.dumps(result, indent=2) + "\n")
    print_machine(result["machine"])
    print(f"\n`{result['command']}`\n")
    rows = []
    for key, (name, _) in VARIANTS.items():
        cells = [f"{result['bbc'][key][str(s)]['accuracy_mean']:.3f} ± {result['bbc'][key][str(s)]['accuracy_std']:.3f}"
                 for s in args.sizes]
        rows.append([name, f"{result[f'{key}_seconds'] / 60:.1f} min", *cells])
    print(markdown_table(["student", "distillation", *[f"BBC acc {s}/class" for s in args.sizes]], rows))


if __name__ == "__main__":
    main()
