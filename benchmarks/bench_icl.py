"""In-context learning in a 2-layer GPT trained from scratch on key -> value lists: few-shot accuracy against the
number of demonstrations K, and the induction heads that do it (Olsson et al. 2022, "In-context Learning and
Induction Heads").

Stages (each writes its result under ``--work`` and is skipped when that result exists, so an interrupted run
continues; ``--fresh`` starts over):

1. ``data``: a corpus of ``--sequences`` documents in the ``--format`` (default ``bare``: ``k12 v3 k5 v40 k12 v3
   ...``; ``symbols``: ``k12 = v3 ; k5 = v40 ; ...``), written by ``lmforge.data.synthetic.key_value_corpus``: each
   document draws up to ``--keys`` distinct keys from a pool of ``--n-keys`` and gives each a value drawn uniformly
   from ``--n-values``, afresh per document, and lists ``--pairs`` pairs over those keys; a repeated key's value
   can only be read from the context. A ``--replay-share`` of the documents is one block of pairs repeated
   ``--repeats`` times in the same order (default: none; the keys in random order with repeats), a
   ``--random-share`` are repeated random tokens instead. With ``--curriculum-steps`` > 0 (the default), a second
   corpus of repeated random tokens (N of the keys and values, then the same N again, N in ``--random-tokens``) for
   stage 1; with ``--random-distinct`` (the default) no word occurs twice in a first half, so every repeated
   bigram repeats reliably (with replacement, 30 draws from 48 words repeat a word almost surely, with two different
   successors: two of five seeds then stayed on the plateau through 6,000 steps; distinct, all five leave it).
   The tokenizer is the key-value vocabulary (every key and value one WordPiece token); ``lmforge data prepare
   --format lines`` makes the shards. ``--tasks`` held-out tasks (``key_value_task``), each one fresh
   mapping of ``--task-pairs`` keys: the training file is the demonstration pool, the test file queries every key
   of the mapping.
2. ``train``: ``lmforge pretrain --preset gpt-nano --objective clm`` resized to ``--layers`` layers, ``--d-model``,
   ``--heads``, ``--positional`` positions (pre-LN, GELU, no dropout), batch ``--batch-size`` x ``--seq-len``
   tokens, AdamW ``--lr`` (1e-3) with 5% warm-up then ``--schedule`` (constant), ``--max-grad-norm`` clipping
   (none), ``--weight-decay`` (0), Adam ``--eps`` (1e-8), every training row starting at a document start
   (``--doc-aligned``, ``--data.doc_aligned=true``). Stage 1 (the curriculum): repeated random tokens in chunks of
   ``--curriculum-check`` steps until the training accuracy reaches ``--phase-accuracy`` (the induction phase
   change), at most ``--curriculum-steps``; stage 2: ``--steps`` steps on the key-value documents from stage 1's
   weights. Why: on key-value lists alone a 2-layer model stays on the plateau before the phase change (Olsson et
   al. section 3) through 8,000 steps here; on repeated random tokens it goes through it, and key-value lists then
   retune its induction heads to single-token lookup (``examples/in-context-learning/README.md``).
3. ``eval``, for the trained model and for an untrained model of the same shape (the control):

   * exact next-token accuracy (this script's own loop, independent of ``lmforge.prompting``): for every task,
     K in ``--shots`` and ``--draws`` draws of K demonstrations (without replacement from the task's pool, the
     same demonstrations for every query of a draw), the prompt ``[SEP] k_1 v_1 ... k_K v_K k`` (the template
     and separator of ``--format``) for each query key k; correct when the argmax over the whole vocabulary is
     k's value. Chance is 1 / n_values at K = 0; an ideal copier scores K / task_pairs + (1 - K / task_pairs) /
     n_values (the query's key is among the demonstrations with probability K / task_pairs). Also split by
     whether the key is in the prompt.
   * ``lmforge.prompting.fewshot_evaluate`` (the same template and separator, classification over
     the task's labels by summed log-probability, fixed demonstrations per draw), when that module exists.
   * induction and previous-token scores of every head (``lmforge.viz.induction.head_scores``): ``[SEP]`` then N
     random tokens repeated twice, 32 samples, N = 12, 20, 28, averaged (and the smallest over N, which a
     fixed-offset positional head cannot keep high).
   * the attention viewer (``lmforge.viz.induction.write_prompt_attention``) for one 4-shot prompt whose query key
     is among the demonstrations: ``benchmarks/results/icl-attention.html``.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_icl.py [--quick] [--threads 1]`` (one thread: on a
loaded 2-core machine two threads ran 100x slower). Prints Markdown and writes
``benchmarks/results/icl.json`` and ``icl.png`` (``icl-quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import fmt, machine_description, markdown_table, print_machine, reproduce_command
from lmforge.cli import main as lmforge
from lmforge.data.synthetic import SEPARATOR, TEMPLATE, key_value_corpus, key_value_task, key_value_tokenizer
from lmforge.utils.io import atomic_write_text

HERE = Path(__file__).resolve().parent
# Random tokens per repeat of the induction probe, several lengths: a content-based induction head scores at every
# length, a head that attends at a fixed offset (a positional head; one was seen at offset 31) at one only.
PROBE_LENS = (12, 20, 28)
PROBE_SAMPLES = 32
FORMATS = {"symbols": (TEMPLATE, SEPARATOR), "bare": ("{text} {label}", " ")}  # --format -> (template, separator)


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


# ---------------------------------------------------------------------------------------------- stages
def prepare_shards(work: Path, corpus: str, shards: str) -> None:
    code = lmforge(["-q", "data", "prepare", "--tokenizer", str(work / "tokenizer"), "--input", str(work / corpus),
                    "--out", str(work / shards), "--format", "lines", "--workers", "1", "--overwrite"])
    if code:
        sys.exit(f"data prepare failed ({code})")


def stage_data(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    done = work / "data.json"
    if done.is_file():
        return json.loads(done.read_text())
    start = time.perf_counter()
    counts = key_value_corpus(work / "corpus.txt", n_sequences=args.sequences, pairs_per_sequence=args.pairs,
                              n_keys=args.n_keys, n_values=args.n_values, seed=args.seed,
                              keys_per_sequence=args.keys, template=args.template, separator=args.separator,
                              replay_share=args.replay_share, repeats=args.repeats,
                              random_share=args.random_share, random_tokens=args.random_tokens,
                              random_distinct=args.random_distinct)
    key_value_tokenizer(args.n_keys, args.n_values).save_pretrained(work / "tokenizer", overwrite=True)
    prepare_shards(work, "corpus.txt", "shards")
    info: dict[str, Any] = dict(counts)
    if args.curriculum_steps:  # stage 1: repeated random tokens only (another seed: not the stage-2 documents)
        info["stage1"] = key_value_corpus(
            work / "corpus-stage1.txt", n_sequences=args.sequences, pairs_per_sequence=args.pairs,
            n_keys=args.n_keys, n_values=args.n_values, seed=args.seed + 1_000, template=args.template,
            separator=args.separator, random_share=1.0, random_tokens=args.random_tokens,
            random_distinct=args.random_distinct)
        prepare_shards(work, "corpus-stage1.txt", "shards-stage1")
    (work / "tasks").mkdir(exist_ok=True)
    for t in range(args.tasks):  # seeds far from the corpus's: fresh mappings (random values: nothing to memorise)
        key_value_task(work / "tasks" / f"task{t}-train.jsonl", work / "tasks" / f"task{t}-test.jsonl",
                       n_pairs=args.task_pairs, seed=10_000 + t, n_keys=args.n_keys, n_values=args.n_values)
    info["seconds"] = time.perf_counter() - start
    print(f"data: {counts['documents']:,} documents, {counts['tokens']:,} tokens, "
          f"{counts['repeated_share']:.1%} of the pairs repeat a key of their document; {args.tasks} tasks"
          + (f"; stage 1: {info['stage1']['documents']:,} documents of repeated random tokens"
             if args.curriculum_steps else ""), flush=True)
    atomic_write_text(done, json.dumps(info) + "\n")
    return info


def read_log(run: Path) -> list[dict[str, Any]]:
    """The training lines of a run's metrics.jsonl (those with ``elapsed_s``)."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in (json.loads(line) for line in lines if line.strip()) if "elapsed_s" in r and "step" in r]


def pretrain_command(work: Path, args: argparse.Namespace, stage: int = 2, steps: int | None = None) -> list[str]:
    """The ``lmforge pretrain`` command of a stage: 1 = the curriculum's repeated random tokens (``steps``, at most
    ``--curriculum-steps``), 2 = the key-value documents (``--steps``, from stage 1's weights when there is one)."""
    steps = steps or (args.curriculum_steps if stage == 1 else args.steps)
    shards, out = ("shards-stage1", "model-stage1") if stage == 1 else ("shards", "model")
    init = str(work / "model-stage1") if stage == 2 and args.curriculum_steps else args.init_from
    return ["pretrain", "--preset", "gpt-nano", "--objective", "clm", "--input", str(work / shards),
            "--out", str(work / out), "--max-steps", str(steps), "--batch-size", str(args.batch_size),
            "--seq-len", str(args.seq_len), "--lr", str(args.lr), "--eval-every", "0",
            "--save-every", str(max(steps // 4, 1) if stage == 2 else args.curriculum_check), "--seed", str(args.seed),
            "--resume", "auto",
            f"--model.n_layers={args.layers}", f"--model.d_model={args.d_model}", f"--model.n_heads={args.heads}",
            f"--model.max_seq_len={args.seq_len}", f"--model.positional={args.positional}", "--model.dropout=0.0",
            "--model.attention_dropout=0.0",
            "--train.warmup_ratio=0.05", f"--train.schedule={args.schedule}",
            f"--train.max_grad_norm={args.max_grad_norm}", f"--train.weight_decay={args.weight_decay}",
            f"--train.eps={args.eps}",
            f"--train.log_every={max(steps // 20, 1) if stage == 2 else max(args.curriculum_check // 5, 1)}",
            "--data.eval_fraction=0", *(["--data.doc_aligned=true"] if args.doc_aligned else []),
            *(["--init-from", init] if init else [])]


def train_one(work: Path, args: argparse.Namespace, stage: int) -> dict[str, Any]:
    """Stage 2: one run of ``--steps``. Stage 1: chunks of ``--curriculum-check`` steps (the same run, resumed: the
    schedule is constant) until the training next-token accuracy of the last chunk's last log line reaches
    ``--phase-accuracy`` (the induction phase change: a copier of the repeated half scores about 0.5, a model
    without one about 0.03), at most ``--curriculum-steps``. When the phase change comes varies with the seed."""
    steps = args.steps if stage == 2 else min(args.curriculum_check, args.curriculum_steps)
    run = work / ("model-stage1" if stage == 1 else "model")
    while True:
        command = pretrain_command(work, args, stage, steps)
        print(f"train (stage {stage}): lmforge " + " ".join(command), flush=True)
        if lmforge(command):
            sys.exit("training failed")
        accuracy = read_log(run)[-1].get("lm_accuracy") or 0.0
        if stage == 2 or accuracy >= args.phase_accuracy or steps >= args.curriculum_steps:
            break
        steps = min(steps + args.curriculum_check, args.curriculum_steps)
    log = read_log(run)
    last = log[-1]
    return {"steps": last["step"], "training_s": last["elapsed_s"], "tokens": last.get("tokens"),
            "loss_last": last.get("loss"), "lm_accuracy_last": last.get("lm_accuracy"),
            "command": "lmforge " + " ".join(command),
            "curve": [{k: r.get(k) for k in ("step", "loss", "lm_accuracy", "elapsed_s")} for r in log]}


def stage_train(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    done = work / "train.json"
    if done.is_file():
        return json.loads(done.read_text())
    info = train_one(work, args, 2) if not args.curriculum_steps else \
        {"stage1": train_one(work, args, 1), **train_one(work, args, 2)}
    if args.curriculum_steps:  # the totals of both stages (the report's minutes and steps)
        info["stage2_training_s"], info["stage2_steps"] = info["training_s"], info["steps"]
        info["training_s"] += info["stage1"]["training_s"]
        info["steps"] += info["stage1"]["steps"]
    atomic_write_text(done, json.dumps(info) + "\n")
    return info


# ---------------------------------------------------------------------------------------------- evaluation
def load_models(work: Path, seed: int):
    """(trained model, untrained model of the same config, tokenizer)."""
    from lmforge.persistence import build_backbone, load_pretrained
    from lmforge.tokenizers import WordPieceTokenizer

    loaded = load_pretrained(work / "model")
    torch.manual_seed(seed + 1)
    control = build_backbone(loaded.config).eval()
    return loaded.model.eval(), control, WordPieceTokenizer.from_pretrained(work / "tokenizer")


def read_task(work: Path, t: int):
    from lmforge.data.readers import read_classification

    return (read_classification(work / "tasks" / f"task{t}-train.jsonl").examples,
            read_classification(work / "tasks" / f"task{t}-test.jsonl").examples)


def prompt_text(demos, query: str, template: str, separator: str) -> str:
    """``[SEP] k = v ; ... ; query =``: the demonstrations through the template and separator, the query up to the
    label slot; the leading [SEP] is the document start of lmforge's causal-LM stream."""
    parts = [template.format(text=d.text, label=d.label) for d in demos]
    parts.append(template[:template.index("{label}")].format(text=query).rstrip())
    return "[SEP] " + separator.join(parts)


@torch.inference_mode()
def greedy_accuracy(model, tokenizer, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Exact next-token accuracy of the value after ``key =`` per K (see the module docstring): mean and standard
    deviation over tasks x draws, and accuracy split by whether the query's key is in the prompt."""
    rows = []
    for K in args.shots:
        accuracies, seen_hits, seen_n, unseen_hits, unseen_n = [], 0, 0, 0, 0
        for t in range(args.tasks):
            pool, queries = read_task(work, t)
            rng = np.random.default_rng(1_000 * t + K)
            for _ in range(args.draws if K > 0 else 1):  # K = 0 has nothing to draw
                demos = [pool[i] for i in rng.choice(len(pool), size=K, replace=False)]
                shown = {d.text for d in demos}
                prompts = [prompt_text(demos, q.text, args.template, args.separator) for q in queries]
                ids = torch.tensor([tokenizer.encode_ids(p) for p in prompts])  # (N, T): one length per draw
                predicted = model(ids).logits[:, -1].argmax(-1).tolist()  # (N,)
                want = [tokenizer.vocab[q.label] for q in queries]
                correct = [p == w for p, w in zip(predicted, want, strict=True)]
                accuracies.append(float(np.mean(correct)))
                for q, ok in zip(queries, correct, strict=True):
                    if q.text in shown:
                        seen_hits, seen_n = seen_hits + ok, seen_n + 1
                    else:
                        unseen_hits, unseen_n = unseen_hits + ok, unseen_n + 1
        ideal = K / args.task_pairs + (1 - K / args.task_pairs) / args.n_values
        rows.append({"shots": K, "accuracy_mean": float(np.mean(accuracies)), "accuracy_std": float(np.std(accuracies)),
                     "accuracies": accuracies, "accuracy_key_in_prompt": seen_hits / seen_n if seen_n else None,
                     "accuracy_key_not_in_prompt": unseen_hits / unseen_n if unseen_n else None,
                     "ideal_copier": ideal, "chance": 1 / args.n_values})
    return rows


def prompting_accuracy(model, tokenizer, work: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """``lmforge.prompting.fewshot_evaluate`` over the tasks: each task's report rows, and per K the mean and
    standard deviation over all tasks x draws. None when ``lmforge.prompting`` is not installed."""
    try:
        from lmforge.prompting import FewShotConfig, fewshot_evaluate
    except ImportError:
        return None
    cfg = FewShotConfig(template=args.template, verbalizer=None, shots=tuple(args.shots), draws=args.draws,
                        seed=args.seed, demos="fixed", scoring="sum", calibrate=False, separator=args.separator,
                        mode="classify")
    per_task = []
    for t in range(args.tasks):
        train, test = read_task(work, t)
        per_task.append(fewshot_evaluate(model, tokenizer, train, test, cfg))
    rows = []
    for i, K in enumerate(args.shots):
        accuracies = [a for report in per_task for a in report.rows[i]["accuracies"]]
        rows.append({"shots": K, "accuracy_mean": float(np.mean(accuracies)),
                     "accuracy_std": float(np.std(accuracies)), "accuracies": accuracies,
                     "dropped_demos": sum(report.rows[i].get("dropped_demos", 0) for report in per_task)})
    return {"rows": rows, "per_task": [report.to_dict() for report in per_task]}


def attention_prompt(work: Path, args: argparse.Namespace) -> str:
    """A 4-shot prompt of task 0 whose query is the second demonstration's key (so the induction head has
    something to find)."""
    pool, _ = read_task(work, 0)
    demos = pool[:4]
    return prompt_text(demos, demos[1].text, args.template, args.separator)


def stage_eval(work: Path, args: argparse.Namespace, html_path: Path) -> dict[str, Any]:
    from lmforge.viz.induction import head_scores, write_prompt_attention

    trained, control, tokenizer = load_models(work, args.seed)
    results: dict[str, Any] = {}
    for name, model in (("trained", trained), ("untrained", control)):
        start = time.perf_counter()
        probes = [head_scores(model, tokenizer, seq_len=n, n_repeats=2, n_samples=PROBE_SAMPLES, seed=args.seed,
                              prefix=[tokenizer.sep_id]) for n in PROBE_LENS]
        scores = combine(probes)
        results[name] = {"greedy": greedy_accuracy(model, tokenizer, work, args),
                         "fewshot": prompting_accuracy(model, tokenizer, work, args),
                         "heads": {**scores.to_dict(), "per_probe_length": [p.to_dict() for p in probes],
                                   "induction_min_over_lengths": np.min([p.induction for p in probes], 0).round(4)
                                   .tolist()}}
        results[name]["seconds"] = time.perf_counter() - start
        if name == "trained":
            text = attention_prompt(work, args)
            write_prompt_attention(model, tokenizer, text, html_path, scores=scores)
            results["attention_html"] = {"path": str(html_path.relative_to(HERE.parent)), "prompt": text}
        print(f"eval: {name} in {results[name]['seconds']:.1f} s", flush=True)
    return results


def combine(probes):
    """One HeadScores with the mean of the probes' scores (the probe lengths differ, the sample counts do not)."""
    from lmforge.viz.induction import HeadScores

    return HeadScores(np.mean([p.induction for p in probes], 0), np.mean([p.previous_token for p in probes], 0),
                      float(np.mean([p.uniform for p in probes])), probes[0].seq_len, probes[0].n_repeats,
                      sum(p.n_samples for p in probes))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ev = result["eval"]
    shots = [r["shots"] for r in ev["trained"]["greedy"]]
    xs = np.arange(len(shots))
    for name, style in (("trained", "o-"), ("untrained", "s--")):
        rows = ev[name]["greedy"]
        ax.errorbar(xs, [r["accuracy_mean"] for r in rows], yerr=[r["accuracy_std"] for r in rows], fmt=style,
                    capsize=3, label=f"{name}: next-token accuracy")
        if ev[name]["fewshot"] is not None:
            rows = ev[name]["fewshot"]["rows"]
            ax.plot(xs, [r["accuracy_mean"] for r in rows], style[0] + ":", label=f"{name}: fewshot_evaluate")
    ax.plot(xs, [r["ideal_copier"] for r in ev["trained"]["greedy"]], "k:", label="ideal copier")
    ax.axhline(ev["trained"]["greedy"][0]["chance"], color="grey", lw=0.8, label="chance (1 / n_values)")
    ax.set_xticks(xs, [str(k) for k in shots])
    ax.set_xlabel("demonstrations K")
    ax.set_ylabel("accuracy on held-out mappings")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("In-context learning of fresh key -> value mappings", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- main
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="runs/bench-icl", help="working folder (resumable)")
    parser.add_argument("--sequences", type=int, default=30_000, help="training documents")
    parser.add_argument("--pairs", type=_range, default=(16, 64), help="pairs per document: LOW,HIGH")
    parser.add_argument("--keys", type=_range, default=(32, 32), help="distinct keys per document: LOW,HIGH")
    parser.add_argument("--format", choices=list(FORMATS), default="bare",
                        help="symbols: 'k12 = v3 ; k5 = v40' (template '{text} = {label}', separator ' ; '); bare: "
                        "'k12 v3 k5 v40' (template '{text} {label}', separator ' ')")
    parser.add_argument("--n-keys", type=int, default=32, help="the key pool")
    parser.add_argument("--n-values", type=int, default=16, help="the value pool")
    parser.add_argument("--replay-share", type=float, default=0.0,
                        help="share of documents that are one block of pairs repeated --repeats times")
    parser.add_argument("--repeats", type=_range, default=(4, 4), help="blocks of a replay document: N or LOW,HIGH "
                        "(drawn per document)")
    parser.add_argument("--random-share", type=float, default=0.0,
                        help="share of documents that are N random key/value words repeated twice (Olsson et al.'s "
                             "repeated random tokens) instead of pairs")
    parser.add_argument("--random-tokens", type=_range, default=(10, 48), help="N of those documents: N or LOW,HIGH "
                        "(at most --n-keys + --n-values with --random-distinct)")
    parser.add_argument("--random-distinct", action=argparse.BooleanOptionalAction, default=True,
                        help="no word twice in the first half of a repeated-random-tokens document (N at most "
                             "--n-keys + --n-values): every repeated bigram then repeats reliably")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--positional", default="rotary", help="learned, sinusoidal or rotary")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000, help="steps on the key-value documents (stage 2)")
    parser.add_argument("--curriculum-steps", type=int, default=6000,
                        help="stage 1: at most this many steps on repeated random tokens before the key-value "
                             "documents (0: no stage 1)")
    parser.add_argument("--curriculum-check", type=int, default=1500,
                        help="stage 1 stops at the first multiple of this many steps where the training accuracy "
                             "reached --phase-accuracy")
    parser.add_argument("--phase-accuracy", type=float, default=0.3,
                        help="stage 1's training next-token accuracy that marks the induction phase change")
    parser.add_argument("--doc-aligned", action=argparse.BooleanOptionalAction, default=True,
                        help="every training row starts at a document start (--data.doc_aligned=true)")
    parser.add_argument("--init-from", default="",
                        help="start from this model folder's weights (a curriculum's second stage)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--schedule", default="constant", help="lr schedule after the 5%% warm-up (lmforge's "
                        "train.schedule: constant, linear, cosine, ...)")
    parser.add_argument("--max-grad-norm", type=float, default=0.0, help="gradient clipping (0: none)")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--eps", type=float, default=1e-8, help="Adam epsilon")
    parser.add_argument("--tasks", type=int, default=5, help="held-out mappings")
    parser.add_argument("--task-pairs", type=int, default=20, help="keys per held-out mapping")
    parser.add_argument("--shots", default="0,1,4,16", help="K values")
    parser.add_argument("--draws", type=int, default=3, help="draws of the demonstrations per task and K")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as OMP_NUM_THREADS says)")
    parser.add_argument("--quick", action="store_true", help="a 1-2 minute smoke run: few steps, 2 tasks")
    parser.add_argument("--fresh", action="store_true", help="remove --work first")
    parser.add_argument("--stem", default="", help="results file names (default icl, icl-quick with --quick)")
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.steps, args.curriculum_steps, args.tasks, args.draws = 5_000, 100, 100, 2, 2
        args.curriculum_check = 50
        args.work = args.work + "-quick"
    args.shots = [int(k) for k in args.shots.split(",")]
    args.template, args.separator = FORMATS[args.format]
    if max(args.shots) > args.task_pairs:
        parser.error(f"--shots up to {max(args.shots)} needs --task-pairs >= that (demonstrations are drawn "
                     "without replacement from a task's pairs)")
    return args


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.work)
    if args.fresh:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    stem = args.stem or ("icl-quick" if args.quick else "icl")
    results_dir = HERE / "results"
    result: dict[str, Any] = {"machine": machine_description(), "torch_threads": torch.get_num_threads(),
                              "command": reproduce_command(__file__, sys.argv[1:]),
                              "settings": {k: v for k, v in vars(args).items() if k != "fresh"}}
    start = time.perf_counter()
    result["data"] = stage_data(work, args)
    result["training"] = stage_train(work, args)
    result["pretrain_command"] = "lmforge " + " ".join(pretrain_command(Path(args.work), args))
    if args.curriculum_steps:
        result["pretrain_command_stage1"] = result["training"]["stage1"]["command"]
    result["eval"] = stage_eval(work, args, results_dir / f"{stem}-attention.html")
    result["wall_s_this_session"] = time.perf_counter() - start
    atomic_write_text(results_dir / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    plot(result, results_dir / f"{stem}.png")
    report(result)


def report(result: dict[str, Any]) -> None:
    print_machine(result["machine"])
    print(f"- torch threads: {result['torch_threads']}")
    print(f"\n```bash\n{result['command']}\n```\n")
    s, d, t = result["settings"], result["data"], result["training"]
    random_docs = d.get("random_documents", 0)
    print(f"Corpus: {d['documents']:,} documents ({random_docs:,} of them repeated random tokens), {d['tokens']:,} "
          f"tokens ({d['repeated_share']:.0%} of the pairs repeat a key of their document); "
          f"keys k0..k{s['n_keys'] - 1}, values v0..v{s['n_values'] - 1}."
          f"\nModel: {s['layers']} layers, d_model {s['d_model']}, {s['heads']} heads (pre-LN GPT, no dropout); "
          f"{t['steps']} steps of {s['batch_size']} x {s['seq_len']} tokens in {t['training_s'] / 60:.1f} min "
          f"(final training loss {fmt(t['loss_last'], 3)}, next-token accuracy {fmt(t['lm_accuracy_last'], 3)}).\n"
          f"Training: `{result['pretrain_command']}`\n")
    if "stage1" in t:
        one = t["stage1"]
        print(f"Curriculum: stage 1, {one['steps']} steps on repeated random tokens ({one['training_s'] / 60:.1f} min, "
              f"final next-token accuracy {fmt(one['lm_accuracy_last'], 3)}; a copier of the repeated half scores "
              f"about 0.5): `{result['pretrain_command_stage1']}`; then the command above for {t['stage2_steps']} "
              "steps from its weights.\n")
    ev = result["eval"]
    print(f"Few-shot accuracy on {s['tasks']} held-out mappings of {s['task_pairs']} keys, {s['draws']} draws of "
          "the demonstrations each (mean +- std over tasks x draws). Next-token: argmax over the whole vocabulary "
          f"(chance {1 / s['n_values']:.3f}); fewshot_evaluate: classification over the task's labels, which never "
          "shows a test example its own pair (its leakage guard), so it measures the key-not-in-prompt case.\n")
    header = ["K", "trained next-token", "key in prompt", "key not in prompt", "untrained next-token",
              "ideal copier", "trained fewshot_evaluate", "untrained fewshot_evaluate"]
    rows = []
    for i, r in enumerate(ev["trained"]["greedy"]):
        u = ev["untrained"]["greedy"][i]
        few = [ev[m]["fewshot"]["rows"][i] if ev[m]["fewshot"] else None for m in ("trained", "untrained")]
        rows.append([str(r["shots"]), f"{r['accuracy_mean']:.3f} +- {r['accuracy_std']:.3f}",
                     fmt(r["accuracy_key_in_prompt"], 3), fmt(r["accuracy_key_not_in_prompt"], 3),
                     f"{u['accuracy_mean']:.3f} +- {u['accuracy_std']:.3f}", f"{r['ideal_copier']:.3f}",
                     *[f"{f['accuracy_mean']:.3f} +- {f['accuracy_std']:.3f}" if f else "n/a (no lmforge.prompting)"
                       for f in few]])
    print(markdown_table(header, rows, align="rrrrrrrr"))
    print(f"\nInduction heads ([SEP] + N random tokens x 2, N = {', '.join(map(str, PROBE_LENS))}, {PROBE_SAMPLES} "
          f"samples each; scores averaged over N; a uniform head scores {ev['trained']['heads']['uniform']:.3f}): "
          "best head per layer, and every head's smallest score over N.\n")
    rows = []
    for name in ("trained", "untrained"):
        h = ev[name]["heads"]
        for layer, ((hi, score), (pi, prev)) in enumerate(zip(h["best_induction"], h["best_previous_token"],
                                                              strict=True)):
            rows.append([name, str(layer), f"head {hi}: {score:.3f}", f"head {pi}: {prev:.3f}",
                         ", ".join(f"{v:.2f}" for v in h["induction"][layer]),
                         ", ".join(f"{v:.2f}" for v in h["induction_min_over_lengths"][layer])])
    print(markdown_table(["model", "layer", "best induction score", "best previous-token score",
                          "induction score of every head", "smallest over N"], rows, align="lrrrll"))
    if "attention_html" in ev:
        print(f"\nAttention viewer: {ev['attention_html']['path']} (prompt `{ev['attention_html']['prompt']}`)")


if __name__ == "__main__":
    main()
