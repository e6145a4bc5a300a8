"""Static embeddings side by side: lmforge Word2Vec (skip-gram, CBOW) against gensim's ``Word2Vec``, and lmforge GloVe.

All trainers read the same tokenized BBC News corpus (each line a sentence; BERT basic words, lower-cased, with
the punctuation characters dropped, as ``lmforge word2vec train`` reads it) and run with the same
hyper-parameters: 100 dimensions, window 5, 5 negatives, ``min_count`` 5, ``sample`` 1e-3, 5 epochs, initial
learning rate 0.025, 2 worker threads. GloVe (gensim has none: gensim#2174): 100 dimensions, window 10, x_max
100, alpha 0.75, learning rate 0.05, 15 epochs, 2 threads.

Each trainer runs in a fresh subprocess (the parent tokenizes once and hands the sentences over in a file);
"seconds" is the training call alone (for gensim, ``Word2Vec(sentences, ...)`` including its vocabulary scan;
for lmforge, ``train_word2vec`` after the corpus is encoded), words/s = corpus words x epochs / seconds. CPU
seconds (all threads of the child from the sentences being read to the end, so lmforge's corpus encoding and
GloVe's co-occurrence counting are included) show the cost when other jobs share the machine: then wall times
mostly measure the waiting.
Quality: nearest neighbours of a few words, and Spearman's rho on WordSim-353 and SimLex-999 (the copies in
gensim's test data) over the pairs whose words both have vectors (the same pairs for every model).

Run: ``.venv/bin/python benchmarks/bench_vectors.py [--quick] [--workers 2]``. Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
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


def quality(kv_similar, kv_pairs) -> dict:
    """Neighbours of the probe words and Spearman on the two similarity files (as far as available)."""
    out: dict = {"neighbours": {w: kv_similar(w) for w in PROBES}}
    for name in ("wordsim353.tsv", "simlex999.txt"):
        path = gensim_data(name)
        if path:
            out[name] = kv_pairs(path)
    return out


def child(method: str, sentences_path: str, epochs: int, workers: int, seed: int) -> None:
    sentences = read_sentences(sentences_path)
    words = sum(len(s) for s in sentences)
    cpu_start = time.process_time()
    if method.startswith("gensim"):
        import logging

        from gensim.models import Word2Vec

        logging.getLogger("gensim").setLevel(logging.WARNING)
        start = time.perf_counter()
        model = Word2Vec(sentences, sg=int(method == "gensim-sg"), vector_size=100, window=5, negative=5,
                         min_count=5, sample=1e-3, alpha=0.025, min_alpha=0.0001, epochs=epochs, workers=workers,
                         seed=seed)
        seconds = time.perf_counter() - start
        kv = model.wv
        from lmforge.embeddings.vectors import KeyedVectors

        ours = KeyedVectors(list(kv.index_to_key), kv.vectors)  # the same evaluation code for everyone
        result = {"seconds": seconds, "losses": None, "vocab": len(ours)}
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

            config = Word2VecConfig(architecture="skipgram" if method == "lmforge-sg" else "cbow", dim=100, window=5,
                                    negative=5, min_count=5, sample=1e-3, epochs=epochs, workers=workers, seed=seed)
            r = train_word2vec(corpus, vocab, config)
            result = {"seconds": r.seconds, "losses": [e.loss for e in r.epochs]}
        ours = r.vectors
        result["vocab"] = len(ours)

    def pairs(path: str) -> dict:
        p = ours.evaluate_pairs(path)
        return {"spearman": p.spearman, "pairs": p.pairs, "total": p.total}

    result.update(quality(lambda w: [x for x, _ in ours.most_similar(w, topn=5)] if w in ours else [], pairs))
    result["words"] = words
    result["cpu_seconds"] = time.process_time() - cpu_start  # all threads; includes lmforge's corpus encoding
    result["peak_mb"] = peak_rss_mb().get("vm_hwm")
    emit_result(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"every {QUICK_FILE_STRIDE}th file, 1 epoch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="Word2Vec epochs (GloVe runs 3x as many)")
    parser.add_argument("--methods", default="gensim-sg,lmforge-sg,gensim-cbow,lmforge-cbow,glove")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--_child", nargs=2, metavar=("METHOD", "SENTENCES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        method, path = args._child
        epochs = args.epochs * 3 if method == "glove" else args.epochs
        child(method, path, epochs, args.workers, args.seed)
        return

    from lmforge.data.corpora import bbc_news_dir
    from lmforge.data.text import ReadStats, collect_text_files, read_texts
    from lmforge.embeddings.vocab import split_words
    from lmforge.tokenizers import BasicTokenizer

    epochs = 1 if args.quick else args.epochs
    print_machine()
    print(f"- gensim: {package_version('gensim')}")
    print("\n```bash\n" + reproduce_command(__file__, sys.argv[1:]) + "\n```\n")
    files = collect_text_files([bbc_news_dir()])
    if args.quick:
        files = files[::QUICK_FILE_STRIDE]
    tokenizer = BasicTokenizer()
    stats = ReadStats()
    start = time.perf_counter()
    sentences = [words for _, text in read_texts(files, stats) for line in text.splitlines()
                 if (words := split_words(line, tokenizer))]
    n_words = sum(len(s) for s in sentences)
    print(f"Corpus: BBC News, {stats.summary()}; {len(sentences):,} lines with words, {n_words:,} words "
          f"(tokenized once in {time.perf_counter() - start:.1f} s, not counted below).\n")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sentences.txt"
        path.write_text("\n".join(" ".join(s) for s in sentences) + "\n", encoding="utf-8")
        for method in args.methods.split(","):
            results[method] = run_child(__file__, ["--_child", method, str(path), "--epochs", str(epochs),
                                                   "--workers", str(args.workers), "--seed", str(args.seed)])
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    names = {"gensim-sg": "gensim `Word2Vec(sg=1)`", "lmforge-sg": "lmforge `train_word2vec` skip-gram",
             "gensim-cbow": "gensim `Word2Vec(sg=0)`", "lmforge-cbow": "lmforge `train_word2vec` CBOW",
             "glove": "lmforge `train_glove`"}
    rows = []
    for method, r in results.items():
        ep = epochs * 3 if method == "glove" else epochs
        wps = r["words"] * ep / r["seconds"]
        loss = "n/a (not reported)" if not r["losses"] else " → ".join(f"{x:.3f}" for x in r["losses"])
        extra = (f" (+ {r['cooccurrence_seconds']:.1f} s co-occurrences, {r['nnz']:,} entries)"
                 if method == "glove" else "")
        ws = r.get("wordsim353.tsv")
        sl = r.get("simlex999.txt")
        rows.append([names[method], ep, f"{r['seconds']:.1f}{extra}", f"{r['cpu_seconds']:.1f}", f"{wps:,.0f}",
                     f"{r['words'] * ep / r['cpu_seconds']:,.0f}", f"{r['vocab']:,}",
                     f"{ws['spearman']:.3f} ({ws['pairs']})" if ws else "n/a",
                     f"{sl['spearman']:.3f} ({sl['pairs']})" if sl else "n/a", loss,
                     f"{r['peak_mb']:.0f}" if r.get("peak_mb") else "n/a"])
    print(markdown_table(["Trainer", "Epochs", "Training s (wall)", "CPU s", "Words/s (wall)", "Words per CPU s",
                          "Vocab", "WordSim-353 rho (pairs)",
                          "SimLex-999 rho (pairs)", "Loss per epoch", "Peak RSS MB"], rows))
    for a, b in (("lmforge-sg", "gensim-sg"), ("lmforge-cbow", "gensim-cbow")):
        if a in results and b in results:
            print(f"\n- {names[a]}: {results[b]['seconds'] / results[a]['seconds']:.2f}x gensim's speed in wall "
                  f"time, {results[b]['cpu_seconds'] / results[a]['cpu_seconds']:.2f}x in CPU time")
    print("\nNearest neighbours (top 5 by cosine):\n")
    header = ["Word", *[names[m] for m in results]]
    table = [[f"`{w}`", *[", ".join(results[m]["neighbours"][w]) for m in results]] for w in PROBES]
    print(markdown_table(header, table, align="l" * len(header)))
    print(f"\nLoad average at end: {load}")


if __name__ == "__main__":
    main()
