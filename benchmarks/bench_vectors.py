"""Static embeddings side by side: lmforge Word2Vec (skip-gram, CBOW; exact and fast modes) against gensim's
``Word2Vec``, and lmforge GloVe, over several seeds.

Corpora (``--corpus``): ``bbc`` is BBC News tokenized as ``lmforge word2vec train`` reads it (each line a
sentence; BERT basic words, lower-cased, punctuation dropped); ``wiki`` is the Wikipedia text that gensim ships
for its tests (``head500.noblanks.cor``: 250 lines, 331k words, already lower-cased, stop words removed and
Porter-stemmed), with the word-pair files stemmed by gensim's Porter stemmer to match. Every trainer reads the same
sentences and runs with the same hyper-parameters: 100 dimensions, window 5, 5 negatives, ``min_count`` 5,
``sample`` 1e-3, 5 epochs, initial learning rate 0.025, 2 worker threads. GloVe (gensim has none: gensim#2174):
100 dimensions, window 10, x_max 100, alpha 0.75, learning rate 0.05, 15 epochs, 2 threads.

Each run is a fresh subprocess (the parent tokenizes once and hands the sentences over in a file). "Training s"
is the training alone: gensim's ``train()`` after ``build_vocab()`` (its vocabulary scan is reported apart), and
lmforge's ``train_word2vec`` / ``train_glove`` after the corpus is encoded; words/s = corpus words x epochs /
training seconds. CPU seconds cover all threads of the child from the sentences being read to the end.
Quality: Spearman's rho on WordSim-353 and SimLex-999 (gensim's test copies) over the pairs whose words both have
vectors, as mean +- standard deviation over the seeds, and the nearest neighbours of a few words (first seed).

Run: ``.venv/bin/python benchmarks/bench_vectors.py [--quick] [--corpus bbc|wiki] [--seeds 1,2,3,4,5]``. Prints
Markdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    emit_result,
    markdown_table,
    package_version,
    peak_rss_mb,
    print_machine,
    reproduce_command,
    run_child,
)

PROBES = ("government", "film", "market", "player", "music", "minister")
QUICK_FILE_STRIDE = 10


def gensim_data(name: str) -> str | None:
    try:
        from gensim.test.utils import datapath
    except ImportError:
        return None
    path = datapath(name)
    return path if os.path.isfile(path) else None


def read_sentences(path: str) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return [line.split() for line in f if line.strip()]


def child(method: str, sentences_path: str, epochs: int, workers: int, seed: int, pair_files: list[str],
          probes: list[str]) -> None:
    sentences = read_sentences(sentences_path)
    words = sum(len(s) for s in sentences)
    cpu_start = time.process_time()
    result: dict = {}
    if method.startswith("gensim"):
        import logging

        from gensim.models import Word2Vec

        logging.getLogger("gensim").setLevel(logging.WARNING)
        model = Word2Vec(sg=int(method == "gensim-sg"), vector_size=100, window=5, negative=5, min_count=5,
                         sample=1e-3, alpha=0.025, min_alpha=0.0001, epochs=epochs, workers=workers, seed=seed)
        start = time.perf_counter()
        model.build_vocab(sentences)
        result["vocab_seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        model.train(sentences, total_examples=model.corpus_count, epochs=epochs)
        seconds = time.perf_counter() - start
        kv = model.wv
        from lmforge.embeddings.vectors import KeyedVectors

        ours = KeyedVectors(list(kv.index_to_key), kv.vectors)  # the same evaluation code for everyone
        result.update({"seconds": seconds, "losses": None, "vocab": len(ours)})
    else:
        from lmforge.embeddings.vocab import EncodedCorpus

        corpus = EncodedCorpus.from_sentences(sentences)
        vocab = corpus.build_vocabulary(5)
        if method == "glove":
            from lmforge.embeddings.glove import GloVeConfig, train_glove

            config = GloVeConfig(dim=100, window=10, min_count=5, epochs=epochs, workers=workers, seed=seed)
            r = train_glove(corpus, vocab, config)
            result = {"seconds": r.seconds, "cooccurrence_seconds": r.cooccurrence_seconds, "nnz": r.nnz,
                      "losses": [e.loss for e in r.epochs]}
        else:
            from lmforge.embeddings.word2vec import Word2VecConfig, train_word2vec

            config = Word2VecConfig(architecture="skipgram" if "-sg" in method else "cbow",
                                    mode="fast" if method.endswith("-fast") else "exact", dim=100, window=5,
                                    negative=5, min_count=5, sample=1e-3, epochs=epochs, workers=workers, seed=seed)
            r = train_word2vec(corpus, vocab, config)
            result = {"seconds": r.seconds, "losses": [e.loss for e in r.epochs]}
        ours = r.vectors
        result["vocab"] = len(ours)

    result["neighbours"] = {w: [x for x, _ in ours.most_similar(w, topn=5)] if w in ours else [] for w in probes}
    for path in pair_files:
        p = ours.evaluate_pairs(path)
        result[Path(path).name] = {"spearman": p.spearman, "pairs": p.pairs, "total": p.total}
    result["words"] = words
    result["cpu_seconds"] = time.process_time() - cpu_start  # all threads; includes lmforge's corpus encoding
    result["peak_mb"] = peak_rss_mb().get("vm_hwm")
    emit_result(result)


def bbc_sentences(quick: bool) -> tuple[list[list[str]], str]:
    from lmforge.data.corpora import bbc_news_dir
    from lmforge.data.text import ReadStats, collect_text_files, read_texts
    from lmforge.embeddings.vocab import split_words
    from lmforge.tokenizers import BasicTokenizer

    files = collect_text_files([bbc_news_dir()])
    if quick:
        files = files[::QUICK_FILE_STRIDE]
    tokenizer = BasicTokenizer()
    stats = ReadStats()
    sentences = [words for _, text in read_texts(files, stats) for line in text.splitlines()
                 if (words := split_words(line, tokenizer))]
    return sentences, f"BBC News, {stats.summary()}"


def wiki_sentences(quick: bool) -> tuple[list[list[str]], str]:
    path = gensim_data("head500.noblanks.cor")
    if path is None:
        raise SystemExit("gensim's test data (head500.noblanks.cor) is not installed: pip install gensim")
    sentences = read_sentences(path)
    if quick:
        sentences = sentences[::QUICK_FILE_STRIDE]
    return sentences, "gensim's head500.noblanks.cor (Wikipedia, stemmed, stop words removed)"


def stemmed_pairs(src: str, dst: Path) -> str:
    """A copy of a word-pair file with both words Porter-stemmed (gensim's stemmer, as the wiki corpus is)."""
    from gensim.parsing.porter import PorterStemmer

    stem = PorterStemmer().stem
    out = []
    for line in Path(src).read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) < 3:
            out.append(line)
        else:
            out.append("\t".join([stem(parts[0].lower()), stem(parts[1].lower()), *parts[2:]]))
    dst.write_text("\n".join(out) + "\n", encoding="utf-8")
    return str(dst)


def mean_sd(values: list[float]) -> str:
    m = statistics.fmean(values)
    return f"{m:.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{m:.3f}"


NAMES = {"gensim-sg": "gensim `Word2Vec(sg=1)`", "lmforge-sg": "lmforge skip-gram, exact",
         "lmforge-sg-fast": "lmforge skip-gram, fast", "gensim-cbow": "gensim `Word2Vec(sg=0)`",
         "lmforge-cbow": "lmforge CBOW, exact", "lmforge-cbow-fast": "lmforge CBOW, fast",
         "glove": "lmforge GloVe"}
PAIR_FILES = ("wordsim353.tsv", "simlex999.txt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"every {QUICK_FILE_STRIDE}th file or line, 1 epoch, "
                        "1 seed")
    parser.add_argument("--corpus", choices=("bbc", "wiki"), default="bbc")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="Word2Vec epochs (GloVe runs 3x as many)")
    parser.add_argument("--methods", default=",".join(NAMES))
    parser.add_argument("--seeds", default="1,2,3,4,5", help="comma-separated seeds (default 1,2,3,4,5)")
    parser.add_argument("--_child", nargs=2, metavar=("METHOD", "SENTENCES"), help=argparse.SUPPRESS)
    parser.add_argument("--_pairs", default="", help=argparse.SUPPRESS)
    parser.add_argument("--_seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--_probes", default=",".join(PROBES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        method, path = args._child
        epochs = args.epochs * 3 if method == "glove" else args.epochs
        child(method, path, epochs, args.workers, args._seed, [p for p in args._pairs.split(",") if p],
              args._probes.split(","))
        return

    epochs = 1 if args.quick else args.epochs
    seeds = [int(x) for x in args.seeds.split(",")][: 1 if args.quick else None]
    methods = args.methods.split(",")
    print_machine()
    print(f"- gensim: {package_version('gensim')}")
    print("\n```bash\n" + reproduce_command(__file__, sys.argv[1:]) + "\n```\n")
    start = time.perf_counter()
    sentences, described = (bbc_sentences if args.corpus == "bbc" else wiki_sentences)(args.quick)
    n_words = sum(len(s) for s in sentences)
    print(f"Corpus: {described}; {len(sentences):,} lines with words, {n_words:,} words (read once in "
          f"{time.perf_counter() - start:.1f} s, not counted below). Seeds: {', '.join(map(str, seeds))}.\n")
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sentences.txt"
        path.write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
        pair_files = [p for name in PAIR_FILES if (p := gensim_data(name))]
        probes = list(PROBES)
        if args.corpus == "wiki":
            from gensim.parsing.porter import PorterStemmer

            pair_files = [stemmed_pairs(p, Path(tmp) / Path(p).name) for p in pair_files]
            probes = [PorterStemmer().stem(w) for w in PROBES]
        for seed in seeds:
            for method in methods:  # seeds outermost: a slow spell of the machine hits every method alike
                runs[method].append(run_child(__file__, [
                    "--_child", method, str(path), "--epochs", str(epochs), "--workers", str(args.workers),
                    "--_seed", str(seed), "--_pairs", ",".join(pair_files), "--_probes", ",".join(probes)]))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    rows = []
    for method, rs in runs.items():
        ep = epochs * 3 if method == "glove" else epochs
        words = rs[0]["words"]
        seconds = statistics.median(r["seconds"] for r in rs)
        cpu = statistics.median(r["cpu_seconds"] for r in rs)
        extra = ""
        if method == "glove":
            extra = f" (+ {statistics.median(r['cooccurrence_seconds'] for r in rs):.1f} s co-occurrences)"
        elif method.startswith("gensim"):
            extra = f" (+ {statistics.median(r['vocab_seconds'] for r in rs):.2f} s vocabulary)"
        quality = []
        for name in PAIR_FILES:
            got = [r[name] for r in rs if name in r]
            quality.append(f"{mean_sd([g['spearman'] for g in got])} ({got[0]['pairs']})" if got else "n/a")
        loss = "n/a (not reported)" if not rs[0]["losses"] else " → ".join(f"{x:.3f}" for x in rs[0]["losses"])
        rows.append([NAMES[method], ep, f"{seconds:.2f}{extra}", f"{cpu:.1f}", f"{words * ep / seconds:,.0f}",
                     f"{rs[0]['vocab']:,}", *quality, loss,
                     f"{max(r['peak_mb'] for r in rs):.0f}" if rs[0].get("peak_mb") else "n/a"])
    print(markdown_table(["Trainer", "Epochs", "Training s (median)", "CPU s (median)", "Words/s", "Vocab",
                          "WordSim-353 rho, mean ± sd (pairs)", "SimLex-999 rho, mean ± sd (pairs)",
                          "Loss per epoch (first seed)", "Peak RSS MB"], rows))
    print()
    for ours, ref in (("lmforge-sg", "gensim-sg"), ("lmforge-sg-fast", "gensim-sg"), ("lmforge-cbow", "gensim-cbow"),
                      ("lmforge-cbow-fast", "gensim-cbow")):
        if ours in runs and ref in runs:
            ratios = [b["seconds"] / a["seconds"] for a, b in zip(runs[ours], runs[ref], strict=True)]
            diffs = {name: statistics.fmean(a[name]["spearman"] - b[name]["spearman"]
                                            for a, b in zip(runs[ours], runs[ref], strict=True))
                     for name in PAIR_FILES if name in runs[ours][0]}
            quality = ", ".join(f"{name.split('.')[0]} {d:+.3f}" for name, d in diffs.items())
            print(f"- {NAMES[ours]}: {statistics.median(ratios):.2f}x gensim's training speed (median of the "
                  f"per-seed ratios, {min(ratios):.2f}-{max(ratios):.2f}); rho minus gensim's, mean over seeds: "
                  f"{quality}")
    print("\nNearest neighbours (top 5 by cosine, first seed):\n")
    header = ["Word", *[NAMES[m] for m in runs]]
    table = [[f"`{w}`", *[", ".join(runs[m][0]["neighbours"][w]) for m in runs]] for w in probes]
    print(markdown_table(header, table, align="l" * len(header)))
    print(f"\nLoad average at end: {load}")


if __name__ == "__main__":
    main()
