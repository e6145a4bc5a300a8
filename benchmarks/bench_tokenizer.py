"""WordPiece side by side: lmforge against Hugging Face tokenizers (Rust) and transformers' pure-Python BERT tokenizer.

1. Training an 8,000-token vocabulary on the whole BBC News corpus: lmforge's ``WordPieceTrainer`` with the
   likelihood score (``algorithm="wordpiece"``) and with the pair count (``"bpe-count"``), against
   ``tokenizers.trainers.WordPieceTrainer``. Wall time, CPU time and peak memory, each trainer in a fresh
   subprocess next to one that only loads the corpus; then pieces per word of each vocabulary on the corpus.
2. Encoding every non-empty line of BBC News with MiniLM's ``vocab.txt``: lmforge's ``WordPieceTokenizer``
   one line at a time (ids only, model inputs, model inputs with offsets; cold and warm per-word cache)
   against ``transformers.BertTokenizerFast`` on the whole batch (Rust thread pool at its default and
   restricted to one thread) and against the pure-Python ``transformers.BertTokenizerLegacy``. MB/s and
   tokens/s, and a check that every line gets the same ids (and offsets) from all of them.

Run: ``.venv/bin/python benchmarks/bench_tokenizer.py [--vocab-size 8000] [--quick]``. Prints Markdown.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    emit_result,
    fmt,
    fmt_ratio,
    machine_description,
    markdown_table,
    median_time,
    peak_rss_mb,
    print_machine,
    reproduce_command,
    run_child,
)
from lmforge.data.corpora import bbc_news_dir, minilm_dir
from lmforge.data.text import ReadStats, collect_text_files, read_texts
from lmforge.tokenizers import BasicTokenizer, WordPieceTokenizer, WordPieceTrainer, load_vocab

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TRAINERS = ("wordpiece", "bpe-count", "hf")
QUICK_FILE_STRIDE = 5  # --quick keeps every 5th file of the corpus
WARMUP_LINES = 200  # untimed warm-up slice for the tokenizers that keep no per-word cache


# ---------------------------------------------------------------------------------------------- data
@dataclass
class Corpus:
    """The BBC News texts (one per file), their non-empty lines, and the files that were not UTF-8."""

    texts: list[str]
    files: int
    bad_files: list[str] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        return [line for text in self.texts for line in text.splitlines() if line.strip()]


def load_corpus(quick: bool) -> Corpus:
    """Read BBC News as lmforge does (UTF-8 with replacement; the Latin-1 file is logged, as expected)."""
    root = bbc_news_dir()
    files = collect_text_files([root])
    if quick:
        files = files[::QUICK_FILE_STRIDE]
    stats = ReadStats()
    texts = [text for _, text in read_texts(files, stats)]
    bad = [Path(p).relative_to(root).as_posix() for p in stats.bad_files]
    return Corpus(texts, len(files), bad)


def utf8_bytes(texts: list[str]) -> int:
    return sum(len(t.encode("utf-8")) for t in texts)


# ---------------------------------------------------------------------------------------------- references
def hf_wordpiece(vocab_size: int) -> tuple[Any, Any]:
    """An untrained Hugging Face WordPiece tokenizer set up as BERT uncased, and its trainer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    return tok, trainer


def load_fast_bert(vocab_file: Path) -> Any:
    """``transformers.BertTokenizerFast`` on ``vocab_file``, checked to have loaded it.

    transformers 5 takes ``vocab=`` and silently ignores ``vocab_file=`` (leaving an empty vocabulary);
    transformers 4 takes ``vocab_file=``.
    """
    import transformers

    major = int(transformers.__version__.split(".")[0])
    cls = transformers.BertTokenizerFast
    fast = cls(vocab=str(vocab_file)) if major >= 5 else cls(vocab_file=str(vocab_file))
    expected = len(load_vocab(vocab_file))
    if not fast.is_fast or len(fast) != expected:
        raise RuntimeError(f"BertTokenizerFast did not load the vocabulary ({len(fast)} tokens, expected "
                           f"{expected}); check how this transformers version takes the vocab file")
    return fast


def load_pure_python_bert(vocab_file: Path) -> tuple[Any, str]:
    """transformers' pure-Python BERT tokenizer and its name.

    In transformers 5 ``BertTokenizer`` is the Rust-backed one and the pure-Python one is
    ``BertTokenizerLegacy``; in transformers 4 ``BertTokenizer`` itself is pure Python.
    """
    import transformers

    cls = getattr(transformers, "BertTokenizerLegacy", None)
    if cls is None:
        try:
            from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as cls
        except ImportError:
            cls = transformers.BertTokenizer
    tok = cls(vocab_file=str(vocab_file))
    if tok.is_fast:
        raise RuntimeError(f"transformers.{cls.__name__} is the Rust-backed tokenizer; no pure-Python BERT "
                           "tokenizer found in this transformers version")
    return tok, f"transformers.{cls.__name__}"


# ---------------------------------------------------------------------------------------------- children
def child_train(kind: str, vocab_size: int, quick: bool) -> None:
    """Load the corpus, train one vocabulary (``corpus-only``: none), report time, peak memory, pieces."""
    corpus = load_corpus(quick)
    if kind == "corpus-only":
        emit_result({"peak": peak_rss_mb()})
        return
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if kind == "hf":
        tok, trainer = hf_wordpiece(vocab_size)
        # The decoded texts, not the files: tokenizers' file reader aborts on the Latin-1 file (checked below).
        tok.train_from_iterator(corpus.texts, trainer=trainer, length=len(corpus.texts))
    else:
        tok = WordPieceTrainer(vocab_size, algorithm=kind).train(corpus.texts)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    peak = peak_rss_mb()  # read right after training, before encoding the corpus below
    result: dict[str, Any] = {"wall_s": wall, "cpu_s": cpu, "peak": peak}
    if kind == "hf":
        result["vocab"] = tok.get_vocab_size()
        result["pieces"] = sum(len(e.ids) for e in tok.encode_batch(corpus.texts))
        if corpus.bad_files:
            fresh, trainer = hf_wordpiece(vocab_size)
            try:
                fresh.train([str(bbc_news_dir() / f) for f in corpus.bad_files], trainer)
                result["file_reader"] = "read the non-UTF-8 file(s) without error"
            except Exception as err:  # noqa: BLE001 - report whatever the Rust reader raises
                result["file_reader"] = f"{type(err).__name__}: {err}"
    else:
        result["vocab"] = tok.vocab_size
        result["pieces"] = sum(len(tok.encode_ids(t)) for t in corpus.texts)
    emit_result(result)


def child_rust_encode(repeats: int, quick: bool) -> None:
    """Time ``BertTokenizerFast`` on the batch of all lines, without and with offsets (thread pool per env)."""
    lines = load_corpus(quick).lines
    fast = load_fast_bert(minilm_dir() / "vocab.txt")
    fast(lines[:WARMUP_LINES], return_offsets_mapping=True)
    backend = fast.backend_tokenizer
    # The bare Rust tokenizer, ids only (no offsets tracked, no conversion to Python lists): the closest
    # match to lmforge's encode_ids. Older tokenizers have no encode_batch_fast.
    bare = getattr(backend, "encode_batch_fast", None)
    emit_result({
        "ids_s": median_time(lambda: fast(lines), repeats, warmup=0),
        "offsets_s": median_time(lambda: fast(lines, return_offsets_mapping=True), repeats, warmup=0),
        "bare_s": None if bare is None else median_time(lambda: bare(lines, add_special_tokens=False), repeats,
                                                        warmup=0),
        "rayon_num_threads": os.environ.get("RAYON_NUM_THREADS"),
    })


# ---------------------------------------------------------------------------------------------- main
def child_args(args: argparse.Namespace) -> list[str]:
    """The options a child needs to see the same corpus and settings."""
    out = ["--vocab-size", str(args.vocab_size), "--repeats", str(args.repeats)]
    return out + (["--quick"] if args.quick else [])


def count_mismatches(a: list[list[Any]], b: list[list[Any]]) -> int:
    return sum(1 for x, y in zip(a, b, strict=True) if list(map(_plain, x)) != list(map(_plain, y)))


def _plain(v: Any) -> Any:
    return tuple(v) if isinstance(v, list | tuple) else v


def run(args: argparse.Namespace) -> int:
    """Run every measurement and print the Markdown report; returns the exit code (1 if outputs differ)."""
    machine = machine_description()
    script = Path(__file__)
    cargs = child_args(args)
    began = time.perf_counter()

    # Fresh processes first, while this one is still small. Peak memory is each child's own (VmHWM).
    print("Training in fresh subprocesses...", file=sys.stderr, flush=True)
    train = {kind: run_child(script, ["--_train-one", kind, *cargs]) for kind in ("corpus-only", *TRAINERS)}
    print("Rust encoder in fresh subprocesses...", file=sys.stderr, flush=True)
    env_default = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    rust = {"default": run_child(script, ["--_encode-rust", *cargs], env=env_default),
            "1": run_child(script, ["--_encode-rust", *cargs], env={**env_default, "RAYON_NUM_THREADS": "1"})}

    print("Reading the corpus (one Latin-1 file is decoded with replacement and logged; expected)...",
          file=sys.stderr, flush=True)
    corpus = load_corpus(args.quick)
    lines = corpus.lines
    n_bytes = utf8_bytes(lines)
    basic = BasicTokenizer(lowercase=True)
    n_words = sum(len(basic.tokenize(t)) for t in corpus.texts)

    # ---- lmforge encoder: a cold pass builds the per-word cache (it is also the warm-up), then warm passes.
    print("lmforge encoder...", file=sys.stderr, flush=True)
    vocab_file = minilm_dir() / "vocab.txt"
    ours = WordPieceTokenizer.from_pretrained(minilm_dir())
    encode_ids = ours.encode_ids
    start = time.perf_counter()
    ours_ids = [encode_ids(line) for line in lines]
    cold_s = time.perf_counter() - start
    ids_s = median_time(lambda: [encode_ids(line) for line in lines], args.repeats, warmup=0)
    call_s = median_time(lambda: [ours(line) for line in lines], args.repeats, warmup=0)
    offsets_s = median_time(lambda: [ours(line, return_offsets=True) for line in lines], args.repeats, warmup=0)
    ours_full = [ours(line, return_offsets=True) for line in lines]
    n_tokens = sum(len(x) for x in ours_ids)

    # ---- parity with the Rust encoder (untimed here; timings come from the subprocesses above).
    print("Checking parity with the Rust encoder...", file=sys.stderr, flush=True)
    fast = load_fast_bert(vocab_file)
    ref = fast(lines, return_offsets_mapping=True)
    mism_ids = count_mismatches([e["input_ids"] for e in ours_full], ref["input_ids"])
    mism_bare = count_mismatches(ours_ids, [x[1:-1] for x in ref["input_ids"]])
    mism_offsets = count_mismatches([e["offsets"] for e in ours_full], ref["offset_mapping"])

    # ---- pure-Python reference on a fixed subset (it is slow; it keeps no cache, so its speed is per byte).
    print("Pure-Python BERT tokenizer...", file=sys.stderr, flush=True)
    legacy, legacy_name = load_pure_python_bert(vocab_file)
    subset_idx = list(range(0, len(lines), args.legacy_stride))
    subset = [lines[i] for i in subset_idx]
    legacy(subset[:WARMUP_LINES])
    start = time.perf_counter()
    legacy_ids = legacy(subset)["input_ids"]
    legacy_s = time.perf_counter() - start
    mism_legacy = count_mismatches(legacy_ids, [ours_full[i]["input_ids"] for i in subset_idx])
    sub_bytes = utf8_bytes(subset)
    sub_tokens = sum(len(ours_ids[i]) for i in subset_idx)
    total_s = time.perf_counter() - began

    # ------------------------------------------------------------------ report
    def speed(seconds: float, nbytes: int = n_bytes, ntok: int = n_tokens) -> tuple[float, float]:
        return nbytes / seconds / 1e6, ntok / seconds

    print("# Tokenizer benchmarks: lmforge vs Hugging Face\n")
    print("Command (from the repository root):\n")
    print(f"```bash\n{reproduce_command(script, cargs + ['--legacy-stride', str(args.legacy_stride)])}\n```\n")
    print("Machine:\n")
    print_machine(machine)
    try:
        load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load_end = "unknown"
    print(f"- Load average at end: {load_end}\n")
    print("Every process of this run (lmforge and the references alike) uses the same interpreter, environment "
          "and allocator.\n")
    corpus_desc = "every 5th file of BBC News (--quick)" if args.quick else "BBC News, all files"
    print(f"Corpus: {corpus_desc}: {corpus.files:,} files, {utf8_bytes(corpus.texts) / 1e6:.2f} MB of UTF-8, "
          f"{n_words:,} BERT basic words (lower-cased, punctuation split), {len(lines):,} non-empty lines.")
    if corpus.bad_files:
        print(f"{', '.join(corpus.bad_files)} is Latin-1, not UTF-8: it is decoded with replacement (1 character "
              "becomes U+FFFD, which BERT's cleaning drops) and a warning is logged.")

    # training
    hf = train["hf"]

    def peak(r: dict[str, Any]) -> float:
        return r["peak"].get("vm_hwm", r["peak"]["ru_maxrss"])

    hf_extra = peak(hf) - peak(train["corpus-only"])
    rows = [["corpus only (baseline)", "-", "-", "-", "-", fmt(peak(train["corpus-only"]), 0), "0", "-", "-", "-"]]
    names = {"wordpiece": ('lmforge `WordPieceTrainer(algorithm="wordpiece")`', "likelihood score"),
             "bpe-count": ('lmforge `WordPieceTrainer(algorithm="bpe-count")`', "pair count"),
             "hf": ("tokenizers `trainers.WordPieceTrainer` (Rust)", "pair count")}
    for kind in TRAINERS:
        r = train[kind]
        extra = peak(r) - peak(train["corpus-only"])
        ours_row = kind != "hf"
        rows.append([names[kind][0], names[kind][1], f"{r['vocab']:,}", fmt(r["wall_s"]), fmt(r["cpu_s"]),
                     fmt(peak(r), 0), fmt(extra, 0), fmt(r["pieces"] / n_words),
                     fmt_ratio(r["wall_s"] / hf["wall_s"]) if ours_row else "1 (reference)",
                     fmt_ratio(extra / hf_extra) if ours_row and hf_extra > 0 else ("1 (reference)"
                                                                                    if not ours_row else "n/a")])
    print(f"\n## 1. Training the vocabulary ({args.vocab_size:,} tokens)\n")
    print(markdown_table(["Trainer", "Merges by", "Vocab", "Wall s", "CPU s", "Peak RSS MB",
                          "Over baseline MB", "Pieces/word", "Wall ours/HF", "Memory over baseline ours/HF"],
                         rows, "llrrrrrrrr"))
    print("\n- Each trainer runs in its own fresh subprocess: read the corpus, then train (the timed part, "
          "word counting included). Peak RSS is read right after training; 'over baseline' subtracts a "
          "subprocess that only reads the corpus.")
    print("- Peak RSS is each process's VmHWM (/proc/self/status). `getrusage(RUSAGE_SELF).ru_maxrss` in the "
          "same processes gave " + ", ".join(f"{k} {fmt(train[k]['peak']['ru_maxrss'], 0)}" for k in train)
          + " MB; on Linux it also carries over the parent's peak at spawn time, so it can over-state a "
          "small child.")
    print("- CPU s counts every thread of the process: CPU s well above wall s would mean parallel work.")
    print("- Hugging Face is fed the already-decoded texts with `train_from_iterator`: its own file reader "
          "aborts on the Latin-1 file"
          + (f" (`{hf['file_reader']}`)." if "file_reader" in hf else "."))
    print(f"- Settings: lmforge defaults (min_frequency=2, all characters kept); Hugging Face defaults "
          f"(min_frequency=0, no alphabet limit) with vocab_size={args.vocab_size} and the special tokens "
          f"{' '.join(SPECIAL_TOKENS)}; both BERT-uncased normalisation.")
    print("- Pieces/word: WordPiece pieces of the whole corpus encoded with that vocabulary, divided by its "
          "BERT basic words. The likelihood score keeps frequent words in pieces; merging by count "
          "compresses more.")

    # encoding
    rows = []
    ours_rows = [("`encode_ids(line)` (ids only), cold first pass", cold_s),
                 ("`encode_ids(line)` (ids only)", ids_s),
                 ("`tok(line)` (model inputs)", call_s),
                 ("`tok(line, return_offsets=True)`", offsets_s)]
    for label, s in ours_rows:
        mbs, tps = speed(s)
        rows.append(["lmforge `WordPieceTokenizer`", label, "1", f"{len(lines):,}", fmt(s), fmt(mbs),
                     fmt(tps, 0)])
    cores = machine["Cores"]
    for threads, r in (("default", rust["default"]), ("1", rust["1"])):
        shown = f"default ({cores} cores)" if threads == "default" else "1 (`RAYON_NUM_THREADS=1`)"
        for label, s in (("`fast(lines)` (model inputs)", r["ids_s"]),
                         ("`fast(lines, return_offsets_mapping=True)`", r["offsets_s"])):
            mbs, tps = speed(s)
            rows.append(["transformers `BertTokenizerFast` (Rust)", label, shown, f"{len(lines):,}", fmt(s),
                         fmt(mbs), fmt(tps, 0)])
        if r["bare_s"] is not None:
            mbs, tps = speed(r["bare_s"])
            rows.append(["its `backend_tokenizer` (tokenizers, Rust)",
                         "`encode_batch_fast(lines, add_special_tokens=False)` (ids only)", shown,
                         f"{len(lines):,}", fmt(r["bare_s"]), fmt(mbs), fmt(tps, 0)])
    mbs, tps = speed(legacy_s, sub_bytes, sub_tokens)
    rows.append([f"`{legacy_name}` (pure Python)", "`legacy(lines)` (model inputs)", "1",
                 f"{len(subset):,} (1 in {args.legacy_stride})" if args.legacy_stride > 1 else f"{len(subset):,}",
                 fmt(legacy_s), fmt(mbs), fmt(tps, 0)])
    print("\n## 2. Encoding throughput (MiniLM vocab.txt, 30,522 tokens)\n")
    print(markdown_table(["Encoder", "Call", "Threads", "Lines", "Seconds", "MB/s", "tokens/s"], rows,
                         "lllrrrr"))

    def ratio(ours_s: float, ref_s: float, ref_bytes: int = n_bytes) -> str:
        return fmt_ratio((n_bytes / ours_s) / (ref_bytes / ref_s))

    legacy_ref = (legacy_s, sub_bytes)
    ratios = [
        ["`encode_ids(line)`", "Rust, 1 thread, `fast(lines)`", ratio(ids_s, rust["1"]["ids_s"])],
        ["`encode_ids(line)`", "Rust, 1 thread, bare `encode_batch_fast` (ids only)",
         ratio(ids_s, rust["1"]["bare_s"]) if rust["1"]["bare_s"] else "n/a"],
        ["`tok(line)`", "Rust, 1 thread, `fast(lines)`", ratio(call_s, rust["1"]["ids_s"])],
        ["`tok(line, return_offsets=True)`", "Rust, 1 thread, with offsets",
         ratio(offsets_s, rust["1"]["offsets_s"])],
        ["`tok(line)`", "Rust, default threads, `fast(lines)`", ratio(call_s, rust["default"]["ids_s"])],
        ["`tok(line, return_offsets=True)`", "Rust, default threads, with offsets",
         ratio(offsets_s, rust["default"]["offsets_s"])],
        ["`encode_ids(line)`, cold first pass", "pure Python", ratio(cold_s, *legacy_ref)],
        ["`encode_ids(line)`", "pure Python", ratio(ids_s, *legacy_ref)],
        ["`tok(line)`", "pure Python", ratio(call_s, *legacy_ref)],
        ["`tok(line, return_offsets=True)`", "pure Python (no offsets)", ratio(offsets_s, *legacy_ref)],
    ]
    print("\nSpeed ratios, ours / reference in MB/s (above 1: lmforge is faster):\n")
    print(markdown_table(["lmforge", "Reference", "Speed ours/ref"], ratios, "llr"))

    print("\nSame output:\n")
    print(f"- lmforge `tok(line)` input_ids vs Rust: {mism_ids} mismatching lines of {len(lines):,}")
    print(f"- lmforge `encode_ids(line)` vs Rust ids without [CLS]/[SEP]: {mism_bare} mismatching lines")
    print(f"- lmforge offsets vs Rust `offset_mapping`: {mism_offsets} mismatching lines")
    print(f"- `{legacy_name}` input_ids vs lmforge: {mism_legacy} mismatching lines of {len(subset):,}")

    print("\nNotes:\n")
    print("- MB = 10^6 bytes of UTF-8 input (the lines, without their newlines); tokens = WordPiece pieces, "
          f"without [CLS]/[SEP] ({n_tokens:,} on all lines).")
    print(f"- Warm cache: lmforge keeps a per-word cache; its cold first pass (fresh tokenizer) also warms it, "
          f"and the other lmforge rows are the median of {args.repeats} warm passes. The Rust and pure-Python "
          f"encoders keep no such cache; they get an untimed warm-up on {WARMUP_LINES} lines.")
    print(f"- lmforge encodes one line per call in a Python loop. Rust gets the whole batch in one call (its "
          f"best case), median of {args.repeats}; both Rust settings run in identical fresh subprocesses, "
          "only `RAYON_NUM_THREADS` differs (unset: one thread per core).")
    subset_note = (f"a fixed subset (1 line in {args.legacy_stride}, {sub_bytes / 1e6:.2f} MB) because it is "
                   "slow; with no cache its speed per byte does not depend on the subset. "
                   if args.legacy_stride > 1 else "all lines, ")
    print(f"- `{legacy_name}` is timed once on {subset_note}It has no offsets (slow tokenizers do not "
          "support `return_offsets_mapping`).")
    print(f"- Whole run: {total_s:.0f} s.")
    failed = mism_ids or mism_bare or mism_offsets or mism_legacy
    if failed:
        print("\n**OUTPUTS DIFFER: see the mismatch counts above.**")
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size to train (default 8000)")
    p.add_argument("--quick", action="store_true",
                   help=f"every {QUICK_FILE_STRIDE}th file of the corpus and one repeat: a smoke test")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats, median reported (default 3; 1 quick)")
    p.add_argument("--legacy-stride", type=int, default=4,
                   help="time the pure-Python tokenizer on every Nth line (default 4; 1 = all lines)")
    p.add_argument("--_train-one", choices=("corpus-only", *TRAINERS), help=argparse.SUPPRESS)
    p.add_argument("--_encode-rust", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1 or args.legacy_stride < 1 or args.vocab_size < 1:
        p.error("--repeats, --legacy-stride and --vocab-size must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._train_one or args._encode_rust:
        logging.getLogger("lmforge").setLevel(logging.ERROR)  # the parent reports the Latin-1 file once
        if args._train_one:
            child_train(args._train_one, args.vocab_size, args.quick)
        else:
            child_rust_encode(args.repeats, args.quick)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
