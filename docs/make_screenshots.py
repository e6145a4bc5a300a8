"""Regenerate the README's pictures in docs/images/ (not run by the tests; a few minutes on 2 CPU cores).

    .venv/bin/python docs/make_screenshots.py [--work DIR] [--overwrite]

- ``finetune-training.png``: ``lmforge viz training`` of a short real fine-tuning run: MiniLM (the embedded
  checkpoint) on 300 BBC News articles (60 per topic, their first 600 characters), 3 epochs, the dev set (100 other
  articles) scored every 5 steps, the loss logged every 2.
- ``attention.png``: ``lmforge viz attention`` of the fine-tuned model on one sentence, last layer, four heads, on
  the default absolute 0-1 colour scale.

Everything goes through lmforge's command line, as a user would type it; the run folder is kept under ``--work``
(a new temporary folder by default). Existing pictures are refused unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
import tempfile
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"
MAX_BYTES = 150_000  # keep the repository light: larger PNGs are re-encoded with a 256-colour palette
PER_TOPIC_TRAIN, PER_TOPIC_DEV, CHARS = 60, 20, 600
SENTENCE = "Shares in the bank fell sharply after a profit warning"


def write_bbc_subsets(work: Path) -> tuple[Path, Path]:
    """train.csv and dev.csv: the first articles of every BBC News topic (by file name), shortened."""
    from lmforge.data.corpora import BBC_TOPICS, bbc_news_dir

    rows: dict[str, list[tuple[str, str]]] = {"train": [], "dev": []}
    for topic in BBC_TOPICS:
        files = sorted((bbc_news_dir() / topic).glob("*.txt"))[:PER_TOPIC_TRAIN + PER_TOPIC_DEV]
        for i, path in enumerate(files):
            text = re.sub(r"\s+", " ", path.read_text(encoding="utf-8", errors="replace")).strip()[:CHARS]
            rows["train" if i < PER_TOPIC_TRAIN else "dev"].append((text, topic))
    paths = []
    for split, pairs in rows.items():
        path = work / f"{split}.csv"
        with path.open("w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows(pairs)
        paths.append(path)
    return paths[0], paths[1]


def lmforge(*argv: str) -> None:
    from lmforge.cli import main

    print("$ lmforge " + " ".join(argv), flush=True)
    if main(list(argv)) != 0:
        raise SystemExit(f"lmforge {argv[0]} failed")


def shrink(path: Path) -> None:
    """Re-encode ``path`` with a 256-colour palette when it is larger than MAX_BYTES."""
    from PIL import Image

    from lmforge.utils.io import atomic_write_bytes

    if path.stat().st_size <= MAX_BYTES:
        return
    with Image.open(path) as image:
        buffer = io.BytesIO()
        image.convert("RGB").quantize(256).save(buffer, format="PNG", optimize=True)
    atomic_write_bytes(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the data and the run (default: a new temporary folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing pictures in docs/images/")
    args = parser.parse_args(argv)
    from lmforge.data.corpora import minilm_dir

    work = args.work or Path(tempfile.mkdtemp(prefix="lmforge-screenshots-"))
    work.mkdir(parents=True, exist_ok=True)
    IMAGES.mkdir(parents=True, exist_ok=True)
    training_png, attention_png = IMAGES / "finetune-training.png", IMAGES / "attention.png"
    existing = [str(p) for p in (training_png, attention_png) if p.exists()]
    if existing and not args.overwrite:
        raise SystemExit(f"{', '.join(existing)} exist; pass --overwrite to replace them")
    overwrite = ["--overwrite"] if args.overwrite else []
    train, dev = write_bbc_subsets(work)
    run = work / "topics"
    lmforge("finetune", "--task", "sequence", "--model", str(minilm_dir()), "--train", str(train), "--dev", str(dev),
            "--out", str(run), "--epochs", "3", "--batch-size", "16", "--max-length", "128", "--seed", "0",
            "--train.log_every=2", "--train.eval_every=5", *overwrite)
    lmforge("viz", "training", str(run), "--out", str(training_png),
            "--title", f"lmforge finetune: MiniLM on BBC News topics ({5 * PER_TOPIC_TRAIN} training articles, "
                       f"{5 * PER_TOPIC_DEV} dev)", *overwrite)
    lmforge("viz", "attention", "--model", str(run), "--text", SENTENCE, "--layers", "-1", "--heads", "0,1,2,3",
            "--out", str(attention_png), *overwrite)
    for path in (training_png, attention_png):
        shrink(path)
        print(f"{path}: {path.stat().st_size / 1000:.0f} kB")
    print(f"the run folder: {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
