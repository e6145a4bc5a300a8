"""Do `lmforge finetune`'s defaults learn on a small labelled set? MiniLM (the embedded pretrained BERT) fine-tuned on
1,000 labelled examples with no options besides the files, against the same runs with settings chosen on a dev split
(issue 37, item 5).

Two tasks, one of short single sentences:

* ``trec``: TREC-6 questions (``../shared/data/trec``; 6 classes): train and dev drawn, stratified, from the 5,452
  training questions; TREC's own 500 test questions.
* ``bbc``: BBC News articles (the ``data`` extra; 5 topics): a stratified 20% test split (seed 0, as
  ``lmforge compare``), train and dev drawn from the rest.

Each setting is a ``lmforge finetune`` command line run in this process; its best dev checkpoint (the recipe keeps
it) is then scored once on the test file. ``defaults`` passes nothing but the files; the grid passes ``--lr``,
``--batch-size`` and ``--epochs``. The tuned run is the grid's best on *dev*; its test accuracy is read only after it
is chosen. Results are appended to ``OUT/results.jsonl`` as each run ends (a rerun skips finished ones).

    OMP_NUM_THREADS=1 python benchmarks/bench_finetune_defaults.py --task trec --out runs/ftdefaults-trec
    OMP_NUM_THREADS=1 python benchmarks/bench_finetune_defaults.py --task bbc --out runs/ftdefaults-bbc
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREC = ROOT.parent / "shared" / "data" / "trec"

GRID = {
    "defaults": [],
    "lr2e-5-bs16-ep10": ["--lr", "2e-5", "--batch-size", "16", "--epochs", "10"],
    "lr5e-5-bs16-ep10": ["--lr", "5e-5", "--batch-size", "16", "--epochs", "10"],
    "lr1e-4-bs16-ep10": ["--lr", "1e-4", "--batch-size", "16", "--epochs", "10"],
    "lr1e-4-bs32-ep3": ["--lr", "1e-4", "--batch-size", "32", "--epochs", "3"],
    "lr2e-4-bs16-ep5": ["--lr", "2e-4", "--batch-size", "16", "--epochs", "5"],
}


def _write(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def _draw(rows: list[tuple[str, str]], n_train: int, n_dev: int, seed: int) -> tuple[list, list]:
    """Stratified train and dev draws (each class in proportion), disjoint."""
    from lmforge.data.readers import stratified_split

    labels = [label for _, label in rows]
    rest, train_idx = stratified_split(labels, n_train / len(rows), seed)
    train = [rows[i] for i in train_idx]
    pool = [rows[i] for i in rest]
    _, dev_idx = stratified_split([label for _, label in pool], n_dev / len(pool), seed + 1)
    return train, [pool[i] for i in dev_idx]


def make_data(task: str, folder: Path, n_train: int, n_dev: int, seed: int) -> tuple[Path, Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if task == "trec":
        def read(name: str) -> list[tuple[str, str]]:
            with (TREC / name).open(encoding="utf-8", newline="") as f:
                return [(r["text"], r["label"]) for r in csv.DictReader(f, delimiter="\t",
                                                                       quoting=csv.QUOTE_NONE)]
        pool, test = read("train.tsv"), read("test.tsv")
    else:
        from lmforge.data.corpora import bbc_news_dir
        from lmforge.data.readers import stratified_split

        rows = []
        for topic in sorted(p for p in bbc_news_dir().iterdir() if p.is_dir()):
            for file in sorted(topic.glob("*.txt")):
                text = " ".join(file.read_text(encoding="utf-8", errors="replace").split())
                rows.append((text, topic.name))
        train_idx, test_idx = stratified_split([label for _, label in rows], 0.2, 0)
        pool, test = [rows[i] for i in train_idx], [rows[i] for i in test_idx]
    train, dev = _draw(pool, n_train, n_dev, seed)
    return (_write(folder / "train.csv", train), _write(folder / "dev.csv", dev),
            _write(folder / "test.csv", test))


def run_one(name: str, flags: list[str], data: tuple[Path, Path, Path], out: Path, seed: int) -> dict:
    from lmforge.cli import main
    from lmforge.data.corpora import minilm_dir

    train, dev, test = data
    run = out / "runs" / f"{name}-seed{seed}"
    start = time.perf_counter()
    code = main(["-q", "finetune", "--task", "sequence", "--model", str(minilm_dir()), "--train", str(train),
                 "--dev", str(dev), "--out", str(run), "--seed", str(seed), "--overwrite", *flags])
    if code != 0:
        raise SystemExit(f"{name}: finetune failed ({code})")
    seconds = time.perf_counter() - start
    dev_metrics = json.loads((run / "eval_results.json").read_text())
    report = out / "runs" / f"{name}-seed{seed}-test.json"
    if report.exists():
        report.unlink()
    if main(["-q", "evaluate", "--model", str(run), "--test", str(test), "--out", str(report)]) != 0:
        raise SystemExit(f"{name}: evaluate failed")
    test_metrics = json.loads(report.read_text())
    return {"setting": name, "flags": flags, "seed": seed, "dev_accuracy": dev_metrics["accuracy"],
            "dev_mcc": dev_metrics.get("mcc"), "test_accuracy": test_metrics["accuracy"],
            "test_mcc": test_metrics.get("mcc"), "steps": dev_metrics.get("last_step"), "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=("trec", "bbc"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--n-train", type=int, default=1000)
    p.add_argument("--n-dev", type=int, default=500)
    p.add_argument("--seeds", default="0", help="comma-separated")
    p.add_argument("--settings", default=",".join(GRID), help="comma-separated names of GRID")
    args = p.parse_args(argv)
    out = Path(args.out)
    results = out / "results.jsonl"
    done = set()
    if results.exists():
        done = {(r["setting"], r["seed"]) for r in map(json.loads, results.read_text().splitlines())}
    for seed in [int(s) for s in args.seeds.split(",")]:
        data = make_data(args.task, out / f"data-seed{seed}", args.n_train, args.n_dev, seed)
        for name in args.settings.split(","):
            if (name, seed) in done:
                continue
            record = {"task": args.task, **run_one(name, GRID[name], data, out, seed)}
            print(json.dumps(record), flush=True)
            with results.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
    summarize(results)
    return 0


def summarize(results: Path) -> None:
    """Per seed: the defaults against the grid's best on dev (its test accuracy read after the choice)."""
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    for seed in sorted({r["seed"] for r in rows}):
        mine = [r for r in rows if r["seed"] == seed]
        default = next((r for r in mine if r["setting"] == "defaults"), None)
        tuned = max((r for r in mine if r["setting"] != "defaults"), key=lambda r: r["dev_accuracy"], default=None)
        for label, r in (("defaults", default), ("tuned on dev", tuned)):
            if r is not None:
                print(f"{r['task']} seed {seed} {label:13s} {r['setting']:18s} dev {r['dev_accuracy']:.3f} "
                      f"test {r['test_accuracy']:.3f} (mcc {r['test_mcc']:.3f}, {r['steps']} steps, "
                      f"{r['seconds']:.0f} s)")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
