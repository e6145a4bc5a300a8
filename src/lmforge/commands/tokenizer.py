"""``lmforge tokenizer train`` and ``lmforge tokenizer encode``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tqdm.auto import tqdm

from lmforge.commands.options import Count
from lmforge.data.text import ReadStats, collect_text_files, read_texts
from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.trainer import ALGORITHMS, WordPieceTrainer
from lmforge.tokenizers.wordpiece import VOCAB_NAME, WordPieceTokenizer
from lmforge.utils.io import (
    atomic_open,
    atomic_write_text,
    prepare_output_dir,
    prepare_output_file,
    staged_output_dir,
)


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="text files, or folders searched for .txt files (read as UTF-8)")
    p.add_argument("--vocab-size", type=Count(1, 10_000_000), required=True, metavar="N", help="tokens to reach")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for vocab.txt and tokenizer_config.json")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="wordpiece",
                   help="wordpiece: merge by freq(ab)/(freq(a)freq(b)); bpe-count: merge by freq(ab); words: a "
                        "word-level vocabulary (the most frequent whole words, others [UNK]: ELMo's biLM input)")
    p.add_argument("--no-lowercase", dest="lowercase", action="store_false",
                   help="keep case and accents (a cased vocabulary)")
    p.add_argument("--min-frequency", type=Count(1), default=2, metavar="K",
                   help="never merge rarer pairs (words: leave out rarer words)")
    p.add_argument("--limit-alphabet", type=Count(1), default=None, metavar="N",
                   help="keep only the N most frequent characters")
    p.add_argument("--max-input-chars-per-word", type=Count(1, 1_000_000), default=100, metavar="N",
                   help="a longer word becomes [UNK] instead of pieces (BERT's limit)")
    p.add_argument("--keep-newlines", action="store_true",
                   help="make each line break a token, [NL], that decodes back to a line break (for GPTs that "
                        "should write lines; BERT's tokenizer treats line breaks as spaces)")
    p.add_argument("--overwrite", action="store_true", help="replace a tokenizer already in --out")


def run_train(args: argparse.Namespace) -> int:
    out = prepare_output_dir(args.out, overwrite=args.overwrite, inputs=args.input, create=False)  # before the work
    files = collect_text_files(args.input)
    trainer = WordPieceTrainer(args.vocab_size, algorithm=args.algorithm, min_frequency=args.min_frequency,
                               limit_alphabet=args.limit_alphabet, lowercase=args.lowercase,
                               max_input_chars_per_word=args.max_input_chars_per_word, show_progress=True,
                               newline_token="[NL]" if args.keep_newlines else None)
    stats = ReadStats()
    start = time.perf_counter()
    texts = (text for _, text in read_texts(tqdm(files, desc="counting words", unit="file"), stats))
    counts = trainer.count_words(texts)
    if not counts:
        raise InputFileError(f"the input ({stats.summary()}) holds no words; give text files with content")
    tokenizer = trainer.train_from_word_counts(counts)
    seconds = time.perf_counter() - start
    report = {"algorithm": args.algorithm, "seconds": round(seconds, 3), "files": stats.files,
              "bytes": stats.bytes, "invalid_utf8_bytes": stats.replaced_bytes, **trainer.report}
    lines = [f"{m.left}\t{m.right}\t{m.merged}\t{m.score:.6g}\t{m.count}" for m in trainer.merges]
    with staged_output_dir(out) as tmp:  # the folder appears whole, or not at all
        tokenizer.save_pretrained(tmp)
        atomic_write_text(tmp / "training_report.json", json.dumps(report, indent=2) + "\n")
        atomic_write_text(tmp / "merges.tsv", "left\tright\tmerged\tscore\tcount\n" + "\n".join(lines) + "\n")
    print(f"read {stats.summary()}")
    if args.algorithm == "words":
        print(f"words: {tokenizer.vocab_size} tokens ({trainer.report['words_used']} words of "
              f"{trainer.report['distinct_words']} distinct; {trainer.report['unknown_token_rate']:.2%} of the running "
              f"words become [UNK]) in {seconds:.1f} s")
    else:
        print(f"{args.algorithm}: {tokenizer.vocab_size} tokens ({trainer.report['alphabet']} alphabet units, "
              f"{len(trainer.merges)} merges) from {trainer.report['distinct_words']} distinct words "
              f"in {seconds:.1f} s")
    print(f"saved {out / VOCAB_NAME}, tokenizer_config.json, merges.tsv, training_report.json")
    return 0


def add_encode_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="folder with vocab.txt (ours or BERT's)")
    p.add_argument("--input", required=True, metavar="FILE", help="UTF-8 text, one input per line")
    p.add_argument("--pair-input", metavar="FILE", help="second segments, line by line with --input")
    p.add_argument("--max-length", type=Count(1, 10_000_000), metavar="N", help="truncate (longest first) to N tokens")
    p.add_argument("--out", dest="output", required=True, metavar="FILE.jsonl",
                   help="one JSON line per input line: ids, segment ids, offsets")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")


def _read_lines(path: str) -> list[str]:
    files = collect_text_files([path])
    if len(files) != 1 or Path(path).is_dir():
        raise InputFileError(f"{path}: give one text file, not a folder")
    stats = ReadStats()
    (_, text), = read_texts(files, stats)
    return text.splitlines()


def run_encode(args: argparse.Namespace) -> int:
    prepare_output_file(args.output, overwrite=args.overwrite, inputs=[args.tokenizer, args.input, args.pair_input],
                        option="--out")
    tokenizer = WordPieceTokenizer.from_pretrained(args.tokenizer)
    lines = _read_lines(args.input)
    pairs = _read_lines(args.pair_input) if args.pair_input else None
    if pairs is not None and len(pairs) != len(lines):
        raise LmforgeError(f"{args.pair_input} has {len(pairs)} lines but {args.input} has {len(lines)}; "
                           "give one second segment per input line")
    truncated = 0
    with atomic_open(args.output) as f:
        for i, line in enumerate(tqdm(lines, desc="encoding", unit="line")):
            enc = tokenizer(line, None if pairs is None else pairs[i], max_length=args.max_length,
                            truncation=args.max_length is not None, return_offsets=True)
            truncated += enc.truncated
            record = {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
                      "offsets": [list(o) for o in enc["offsets"]]}
            f.write(json.dumps(record) + "\n")
    note = f"; {truncated} truncated to {args.max_length} tokens" if truncated else ""
    print(f"encoded {len(lines)} lines into {args.output}{note}")
    return 0
