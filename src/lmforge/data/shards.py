"""Tokenized corpora on disk: text files -> memory-mapped shards of token ids, sentences and documents.

``prepare_corpus`` tokenizes text files once (in parallel worker processes) and writes a *prepared folder*::

    files.jsonl                     one record per input file (path, format used, counts, replaced bytes)
    manifest.json                   written last: what the shards hold and how they were made
    shard-00000.ids.npy             flat token ids of the shard, uint16 when vocab_size <= 65535 else uint32
    shard-00000.sent.npy            int64 end offset of each sentence in ids   (sentence k = ids[s[k-1]:s[k]])
    shard-00000.doc.npy             int64 end offset of each document in sent (document d = sentences d[d-1]:d[d])
    shard-00001.*                   ...

A shard holds whole documents and about ``shard_size_tokens`` tokens (more only when one document alone is
larger), so memory while preparing stays bounded by one shard, never the corpus. ``ShardedCorpus`` opens the
shards with ``np.load(mmap_mode="r")``: only the pages read are loaded.

Input formats (``input_format``), decided per file:

* ``"lines"`` — BERT's format (google-research/bert ``create_pretraining_data.py``): one sentence per line,
  blank lines between documents; a file may hold many documents.
* ``"documents"`` — prose: each file is one document; its paragraphs (blocks separated by blank lines, lines
  inside a block joined by a space) are split into sentences by ``lmforge.data.sentences.split_sentences``.
* ``"texts"`` — one short text per line (tweets, reviews, questions): each non-empty line is a document of its
  own, split into sentences.
* ``"auto"`` — a file of at least ``TEXTS_MIN_LINES`` non-empty lines and no blank line between them is read as
  ``texts`` unless it is hard-wrapped prose (at least 60% of its lines but the last end without sentence
  punctuation and are followed by a line starting with a lower-case letter: a paragraph cut at a fixed width).
  Otherwise a file is read as ``lines`` when all of these hold, else as ``documents``:
  (1) at least 60% of its non-empty lines end with sentence punctuation (``. ! ? …``, optionally followed
  by closing quotes or brackets), (2) at least 80% of its non-empty lines hold one sentence for the splitter,
  and (3) it has at least two non-empty lines per blank-line separated block on average. Prose with one
  paragraph per line (the BBC News articles) fails (2) or (3); one sentence per line passes all three. BERT's
  format separates documents by blank lines, so a file without any is not read as one long document: a corpus
  that really is one document of one sentence per line is prepared with ``--format lines``. A large file read in
  pieces (below) is decided once, from its first megabyte.

Empty sentences and documents with no tokens are dropped (and counted in the manifest).

Files are tokenized in worker processes (``workers``), each loading the tokenizer once; small files are sent
in groups, and a lines-format file larger than ``CHUNK_BYTES`` (16 MB) is cut into pieces just after blank
lines (document boundaries), so that one huge BERT-format file is tokenized in parallel and in bounded memory
(a documents-format file is one document and is read whole). At most ``2 * workers`` tasks are in flight.

The tokenizer hash in the manifest is the SHA-256 of the vocabulary written as ``vocab.txt`` writes it (each
token followed by ``\\n``, UTF-8) followed by ``\\nlowercase=true`` or ``false``: the same vocabulary and casing
give the same ids, whatever the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import re
import time
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from lmforge.data.sentences import ends_sentence, split_paragraphs, split_sentences
from lmforge.data.text import check_not_binary, collect_text_files, decode_utf8, strict_utf8_enabled
from lmforge.errors import InputFileError, LmforgeError
from lmforge.tokenizers.wordpiece import WordPieceTokenizer
from lmforge.utils.io import atomic_open, atomic_write_text, prepare_output_dir, staged_output_dir

log = logging.getLogger("lmforge")

__all__ = [
    "FORMAT_VERSION", "INPUT_FORMATS", "MANIFEST_NAME", "ShardedCorpus", "detect_format", "file_documents",
    "load_manifest", "prepare_corpus", "token_dtype", "tokenizer_hash",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
FILES_NAME = "files.jsonl"
INPUT_FORMATS = ("auto", "lines", "documents", "texts")
DEFAULT_SHARD_TOKENS = 1 << 25  # 33.5M tokens: 67 MB of uint16 ids
PREPARE_HINT = "run `lmforge data prepare --tokenizer TOKENIZER_DIR --out {out} FILES_OR_FOLDERS` first"


# ---------------------------------------------------------------------------------------------------- helpers
def tokenizer_hash(tokenizer: WordPieceTokenizer | str | Path) -> str:
    """SHA-256 (hex) of the vocabulary in ``vocab.txt`` form plus the lower-casing flag (see module docstring)."""
    if not isinstance(tokenizer, WordPieceTokenizer):
        tokenizer = WordPieceTokenizer.from_pretrained(tokenizer)
    h = hashlib.sha256()
    h.update("".join(f"{t}\n" for t in tokenizer.ids_to_tokens if t is not None).encode("utf-8"))
    h.update(f"\nlowercase={'true' if tokenizer.lowercase else 'false'}".encode())
    return h.hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65535), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.uint32)


# What each input format means, for the line that says which one a file was read as.
FORMAT_MEANING = {"lines": "one sentence per line, blank lines between documents",
                  "documents": "each file one document, split into sentences",
                  "texts": "one text per line, each a document (no blank line in the file)"}
# A file of at least this many lines and no blank line is auto-read as one text per line.
TEXTS_MIN_LINES = 20
# A lines-format file of one document with at least this many sentences gets a warning: most likely one text per line.
ONE_DOCUMENT_WARNING = 200


def detect_format(text: str) -> str:
    """``"lines"`` or ``"documents"`` for one file's text, by the ``auto`` rule of the module docstring."""
    blocks = split_paragraphs(text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(blocks) == 1 and len(lines) >= TEXTS_MIN_LINES and not _hard_wrapped(lines):
        return "texts"
    if len(lines) < 2 or len(lines) < 2 * len(blocks):
        return "documents"
    punctuated = sum(map(ends_sentence, lines))
    single = sum(1 for ln in lines if len(split_sentences(ln)) <= 1)
    if punctuated >= 0.6 * len(lines) and single >= 0.8 * len(lines):
        return "lines"
    return "documents"


def _hard_wrapped(lines: list[str]) -> bool:
    """Prose cut at a fixed width: most lines end inside a sentence and the next one goes on in lower case."""
    pairs = zip(lines[:-1], lines[1:], strict=True)
    cut = sum(1 for a, b in pairs if not ends_sentence(a) and b.lstrip()[:1].islower())
    return cut >= 0.6 * (len(lines) - 1)


def file_documents(text: str, input_format: str, line_breaks: bool = False) -> tuple[str, list[list[str]]]:
    """The documents of one file's text, each a list of sentence strings (empty ones dropped).

    ``line_breaks`` (a tokenizer with a newline token): the text's line structure is kept inside each document,
    as line breaks at the end of sentences: in the documents format a blank line ("\n\n") after each paragraph but
    the last, in the lines format a "\n" after each line but the document's last (a hard-wrapped paragraph's lines
    are still joined by spaces, and a texts-format document is one line).

    Returns:
        The format used (``"auto"`` resolved) and the documents.
    """
    fmt = detect_format(text) if input_format == "auto" else input_format
    if fmt == "lines":
        docs = [[s for s in (ln.strip() for ln in block.splitlines()) if s] for block in split_paragraphs(text)]
        if line_breaks:
            docs = [[s + "\n" for s in doc[:-1]] + doc[-1:] for doc in docs]
    elif fmt == "documents":
        paragraphs = [split_sentences(block) for block in split_paragraphs(text)]
        paragraphs = [p for p in paragraphs if p]
        if line_breaks:
            paragraphs = [p[:-1] + [p[-1] + "\n\n"] for p in paragraphs[:-1]] + paragraphs[-1:]
        docs = [[s for p in paragraphs for s in p]]
    elif fmt == "texts":
        docs = [split_sentences(ln.strip()) for ln in text.splitlines() if ln.strip()]
    else:
        raise LmforgeError(f"input_format={input_format!r} is not one of {', '.join(INPUT_FORMATS)}")
    return fmt, [d for d in docs if d]


@dataclass
class _FileResult:
    """What a worker returns for one job (a file, or a byte range of a large lines-format file): its documents
    as flat ids plus sentence and document lengths."""

    index: int
    fmt: str
    replaced: int
    nbytes: int
    ids: np.ndarray  # flat token ids of all kept sentences
    sent_lens: np.ndarray  # int64, one per kept sentence
    doc_sents: np.ndarray  # int64, number of kept sentences per kept document
    dropped_sentences: int = 0
    dropped_documents: int = 0


# A job: (file index, path, first byte, end byte or -1 for the end of the file, format or None for the option).
_Job = tuple[int, str, int, int, str | None]

# Files larger than this are read in document-aligned pieces of about this size when they are in the lines
# format (a documents-format file is one document and is read whole).
CHUNK_BYTES = 1 << 24
_BLANK_LINE_BYTES = re.compile(rb"\n[ \t\r\f\v]*\n")
_LINE_BREAK_BYTES = re.compile(rb"\n")

# One tokenizer per worker process, loaded once by the pool initializer (module state only inside workers).
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, input_format: str, dtype: str) -> None:
    _WORKER["tokenizer"] = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    _WORKER["format"] = input_format
    _WORKER["dtype"] = np.dtype(dtype)


def _read_range(path: str, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read() if end < 0 else f.read(end - start)


def _process_job(job: _Job) -> _FileResult:
    index, path, start, end, fmt = job
    tok: WordPieceTokenizer = _WORKER["tokenizer"]
    data = _read_range(path, start, end)
    check_not_binary(data, path)
    text, replaced = decode_utf8(data)
    fmt, docs = file_documents(text, fmt or _WORKER["format"], line_breaks=tok.newline_id is not None)
    dtype = _WORKER["dtype"]
    ids = array("H" if dtype.itemsize == 2 else "I")  # 2 or 4 bytes per token, not a list's ~36
    sent_lens: list[int] = []
    doc_sents: list[int] = []
    dropped_s = dropped_d = 0
    for doc in docs:
        kept = 0
        for sentence in doc:
            piece = tok.encode_ids(sentence)
            if piece:
                ids.extend(piece)
                sent_lens.append(len(piece))
                kept += 1
            else:
                dropped_s += 1  # e.g. only characters BERT's cleaning removes
        if kept:
            doc_sents.append(kept)
        else:
            dropped_d += 1
    return _FileResult(index, fmt, replaced, len(data), np.frombuffer(ids, dtype=ids.typecode).astype(dtype),
                       np.asarray(sent_lens, dtype=np.int64), np.asarray(doc_sents, dtype=np.int64),
                       dropped_s, dropped_d)


def _process_jobs(jobs: list[_Job]) -> list[_FileResult]:
    return [_process_job(job) for job in jobs]


def _cut_points(path: Path, size: int, chunk: int, *, blank: bool = True) -> list[int]:
    """Byte offsets that cut a file into pieces of about ``chunk`` bytes, each just after a blank line (``blank``:
    a lines-format file's document boundary) or any line break (a texts-format file: every line is a document)."""
    boundary = _BLANK_LINE_BYTES if blank else _LINE_BREAK_BYTES
    points = [0]
    window = 1 << 20
    with open(path, "rb") as f:
        pos = chunk
        while pos < size:
            f.seek(pos)
            buf = f.read(window)
            m = boundary.search(buf)
            if m is None:
                if len(buf) < window:
                    break  # no blank line left: the rest is one piece
                pos += window - 64  # keep an overlap so a blank line across two reads is found
                continue
            cut = pos + m.end()
            if cut < size:
                points.append(cut)
            pos = cut + chunk
    points.append(size)
    return points


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the worker reports the error when reading


def _file_jobs(index: int, path: Path, input_format: str, chunk: int) -> list[_Job]:
    """One job per file, or document-aligned byte ranges for a large lines-format file."""
    size = _size(path)
    if size <= chunk or input_format == "documents":
        return [(index, str(path), 0, -1, None)]
    fmt = input_format
    if fmt == "auto":  # decided once for the file, from its beginning
        head = _read_range(str(path), 0, min(size, 1 << 20))
        head = head[:head.rfind(b"\n") + 1] or head
        fmt = detect_format(decode_utf8(head)[0])
    if fmt == "documents":
        return [(index, str(path), 0, -1, "documents")]
    points = _cut_points(path, size, chunk, blank=fmt == "lines")
    return [(index, str(path), a, b, fmt) for a, b in zip(points[:-1], points[1:], strict=True)]


def _tasks(files: list[Path], input_format: str, chunk: int, max_files: int = 64) -> Iterator[list[_Job]]:
    """Jobs grouped into tasks of at most ``max_files`` jobs or about ``chunk`` bytes, so that small files (a
    news article is 2 KB) do not pay one inter-process round trip each."""
    task: list[_Job] = []
    size = 0
    for i, f in enumerate(files):
        for job in _file_jobs(i, f, input_format, chunk):
            task.append(job)
            size += job[3] - job[2] if job[3] >= 0 else _size(f)
            if len(task) >= max_files or size >= chunk:
                yield task
                task, size = [], 0
    if task:
        yield task


def _results(files: list[Path], tokenizer_dir: Path, input_format: str, dtype: np.dtype,
             workers: int) -> Iterator[_FileResult]:
    """Results in file order (pieces of a file in order); with workers > 1, a pool with a bounded window of
    tasks in flight, so memory stays bounded whatever the corpus size."""
    tasks = _tasks(files, input_format, CHUNK_BYTES)
    if workers <= 1:
        _init_worker(str(tokenizer_dir), input_format, dtype.str)
        try:
            for task in tasks:
                for job in task:
                    yield _process_job(job)
        finally:
            _WORKER.clear()
        return
    # fork where available: no re-import of the caller's __main__ (spawn would need a main guard).
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    window = 2 * workers  # results waiting to be written stay bounded (Pool.imap would run ahead unbounded)
    with ctx.Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_dir), input_format, dtype.str)) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.apply_async(_process_jobs, (task,)))
            if len(pending) >= window:
                break
        while pending:
            results = pending.popleft().get()
            task = next(tasks, None)
            if task is not None:
                pending.append(pool.apply_async(_process_jobs, (task,)))
            yield from results


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)


@dataclass
class _ShardWriter:
    """Collects whole documents and writes a shard when it reaches ``limit`` tokens."""

    out_dir: Path
    limit: int
    dtype: np.dtype
    shards: list[dict[str, int]] = field(default_factory=list)
    _ids: list[np.ndarray] = field(default_factory=list)
    _sent_lens: list[np.ndarray] = field(default_factory=list)
    _doc_sents: list[np.ndarray] = field(default_factory=list)
    _tokens: int = 0

    def add(self, ids: np.ndarray, sent_lens: np.ndarray, doc_sents: np.ndarray) -> None:
        """Add the documents of one file (flat ids, sentence lengths, sentences per document)."""
        if not len(doc_sents):
            return
        sent_cum = np.concatenate([[0], np.cumsum(sent_lens)])
        doc_cum = np.concatenate([[0], np.cumsum(doc_sents)])
        doc_tokens = np.diff(sent_cum[doc_cum])
        d = 0
        while d < len(doc_sents):
            # take documents while the shard stays within its limit (always at least one)
            room = self.limit - self._tokens
            fits = np.searchsorted(np.cumsum(doc_tokens[d:]), room, side="right")
            if fits == 0 and self._tokens:
                self.flush()
                continue
            e = d + max(int(fits), 1)
            s0, s1 = doc_cum[d], doc_cum[e]
            self._ids.append(ids[sent_cum[s0]:sent_cum[s1]])
            self._sent_lens.append(sent_lens[s0:s1])
            self._doc_sents.append(doc_sents[d:e])
            self._tokens += int(sent_cum[s1] - sent_cum[s0])
            d = e
            if self._tokens >= self.limit:
                self.flush()

    def flush(self) -> None:
        if not self._doc_sents:
            return
        name = f"shard-{len(self.shards):05d}"
        ids = np.concatenate(self._ids).astype(self.dtype, copy=False)
        sent = np.cumsum(np.concatenate(self._sent_lens), dtype=np.int64)
        doc = np.cumsum(np.concatenate(self._doc_sents), dtype=np.int64)
        _save_npy(self.out_dir / f"{name}.ids.npy", ids)
        _save_npy(self.out_dir / f"{name}.sent.npy", sent)
        _save_npy(self.out_dir / f"{name}.doc.npy", doc)
        self.shards.append({"name": name, "documents": len(doc), "sentences": len(sent), "tokens": len(ids)})
        self._ids, self._sent_lens, self._doc_sents, self._tokens = [], [], [], 0


# ---------------------------------------------------------------------------------------------------- prepare
def prepare_corpus(tokenizer_dir: str | Path, inputs: Sequence[str | Path], out_dir: str | Path, *,
                   input_format: str = "auto", workers: int | None = None,
                   shard_size_tokens: int = DEFAULT_SHARD_TOKENS, overwrite: bool = False,
                   show_progress: bool = True) -> dict[str, Any]:
    """Tokenize text files into a prepared folder of memory-mapped shards (see the module docstring).

    Args:
        tokenizer_dir: folder (or vocab file) of a WordPiece tokenizer.
        inputs: ``.txt`` files and folders (searched recursively for ``*.txt``).
        out_dir: the prepared folder to write.
        input_format: ``"auto"``, ``"lines"`` or ``"documents"``.
        workers: tokenizing processes (``None``: the number of CPUs; 1: in this process).
        shard_size_tokens: tokens per shard (a shard holds whole documents; memory is bounded by one shard).
        overwrite: move a non-empty ``out_dir`` aside (``<name>.old-<time>``) and prepare afresh.
        show_progress: a tqdm bar over files.

    Returns:
        The manifest (also written to ``out_dir/manifest.json``, last).

    Raises:
        InputFileError: no tokenizer, no input files, or no text in them.
        LmforgeError: ``out_dir`` exists and ``overwrite`` is false; a bad option.
    """
    if input_format not in INPUT_FORMATS:
        raise LmforgeError(f"input_format={input_format!r} is not one of {', '.join(INPUT_FORMATS)}")
    if shard_size_tokens < 1:
        raise LmforgeError(f"shard_size_tokens={shard_size_tokens} must be >= 1")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise LmforgeError(f"workers={workers} must be >= 1")
    tokenizer_dir = Path(tokenizer_dir)
    tokenizer = WordPieceTokenizer.from_pretrained(tokenizer_dir)
    files = collect_text_files(inputs)
    final_dir = prepare_output_dir(out_dir, overwrite=overwrite, inputs=[tokenizer_dir, *inputs], create=False)
    # Everything is written into a hidden sibling folder that is renamed to out_dir at the end: an interrupted
    # run leaves no out_dir at all (and its partial folder is removed by the next run), never shards without
    # a manifest.
    with staged_output_dir(final_dir) as staging:
        manifest = _prepare_into(staging, tokenizer, tokenizer_dir, files, inputs, input_format, workers,
                                 shard_size_tokens, show_progress)
        tokenizer.save_pretrained(staging / "tokenizer")  # `lmforge pretrain --input DIR` needs nothing else
    log.info("prepared %d documents, %d sentences, %d tokens in %d shard(s) from %d files in %.1f s (%s)",
             manifest["counts"]["documents"], manifest["counts"]["sentences"], manifest["counts"]["tokens"],
             len(manifest["shards"]), len(files), manifest["seconds"], final_dir)
    return manifest


def _prepare_into(out_dir: Path, tokenizer: WordPieceTokenizer, tokenizer_dir: Path, files: list[Path],
                  inputs: Sequence[str | Path], input_format: str, workers: int, shard_size_tokens: int,
                  show_progress: bool) -> dict[str, Any]:
    dtype = token_dtype(tokenizer.vocab_size)
    writer = _ShardWriter(out_dir, shard_size_tokens, dtype)
    # Per-file records stream to files.jsonl as files complete (results arrive in file order), so the main
    # process keeps no per-file state: its memory is bounded by one shard whatever the number of files.
    files_tmp = out_dir / f".{FILES_NAME}.tmp"
    bad_files: dict[str, int] = {}
    formats: dict[str, int] = {}
    totals = {"bytes": 0, "replaced": 0, "dropped_sentences": 0, "dropped_documents": 0}
    record: dict[str, Any] | None = None

    one_document: list[tuple[str, int]] = []  # lines-format files that hold a single long document

    def finish(rec: dict[str, Any] | None, out) -> None:
        if rec is None:
            return
        out.write(json.dumps(rec) + "\n")
        formats[rec["format"]] = formats.get(rec["format"], 0) + 1
        if rec["format"] == "lines" and rec["documents"] == 1 and rec["sentences"] >= ONE_DOCUMENT_WARNING:
            one_document.append((rec["path"], rec["sentences"]))
        if rec["replaced_bytes"]:
            bad_files[rec["path"]] = rec["replaced_bytes"]

    started = time.perf_counter()
    bar = tqdm(total=len(files), desc="preparing", unit="file", disable=not show_progress)
    try:
        with open(files_tmp, "w", encoding="utf-8") as records_out:
            for res in _results(files, tokenizer_dir, input_format, dtype, min(workers, len(files))):
                writer.add(res.ids, res.sent_lens, res.doc_sents)
                if record is None or record["index"] != res.index:  # the first (often only) piece of a file
                    finish(record, records_out)
                    record = {"index": res.index, "path": str(files[res.index]), "format": res.fmt, "documents": 0,
                              "sentences": 0, "tokens": 0, "bytes": 0, "replaced_bytes": 0}
                    bar.update(1)
                    bar.set_postfix(shards=len(writer.shards), refresh=False)
                record["documents"] += len(res.doc_sents)
                record["sentences"] += len(res.sent_lens)
                record["tokens"] += len(res.ids)
                record["bytes"] += res.nbytes
                record["replaced_bytes"] += res.replaced
                totals["bytes"] += res.nbytes
                totals["dropped_sentences"] += res.dropped_sentences
                totals["dropped_documents"] += res.dropped_documents
            finish(record, records_out)
        writer.flush()
    except BaseException:
        files_tmp.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    for path, n in bad_files.items():
        log.warning("%s: not valid UTF-8, %d byte(s) replaced by U+FFFD; re-save the file as UTF-8 to keep those "
                    "characters", path, n)
    chosen = "; ".join(f"{n} file(s) as {fmt} ({FORMAT_MEANING.get(fmt, fmt)})" for fmt, n in sorted(formats.items()))
    how = "--format auto decided per file (lmforge.data.shards explains the rule)" if input_format == "auto" \
        else f"--format {input_format}"
    log.info("read %s; %s", chosen, how)
    for path, n in one_document[:3]:
        log.warning("%s: read as lines (one sentence per line) with no blank line between documents, so its %d "
                    "lines are one document. If each line is a text of its own (tweets, questions, reviews), prepare "
                    "it with --format texts (what --format auto chooses for such a file)", path, n)
    dropped_sentences, dropped_documents = totals["dropped_sentences"], totals["dropped_documents"]
    total_bytes = totals["bytes"]
    if not writer.shards:
        raise InputFileError(f"the corpus is empty: {len(files)} file(s) hold no text that tokenizes to any "
                             f"token ({', '.join(map(str, inputs))}); give files with some text")
    if bad_files and strict_utf8_enabled():
        path, n = next(iter(bad_files.items()))
        raise InputFileError(f"{path}: not valid UTF-8 ({n} bad byte(s)); save it as UTF-8, or drop --strict-utf8 "
                             "to replace the bad bytes")
    seconds = time.perf_counter() - started
    counts = {k: sum(s[k] for s in writer.shards) for k in ("documents", "sentences", "tokens")}
    manifest = {
        "format": "lmforge-shards",
        "version": FORMAT_VERSION,
        "tokenizer": {"path": str(tokenizer_dir.resolve()), "hash": tokenizer_hash(tokenizer),
                      "lowercase": tokenizer.lowercase},
        "vocab_size": tokenizer.vocab_size,
        "dtype": dtype.name,
        "special_ids": {"pad": tokenizer.pad_id, "unk": tokenizer.unk_id, "cls": tokenizer.cls_id,
                        "sep": tokenizer.sep_id, "mask": tokenizer.mask_id},
        "special_token_ids": sorted(tokenizer.special_ids),
        "input_format": input_format,
        "counts": {**counts, "files": len(files), "bytes": total_bytes,
                   "invalid_utf8_bytes": sum(bad_files.values()), "dropped_empty_sentences": dropped_sentences,
                   "dropped_empty_documents": dropped_documents},
        "shards": writer.shards,
        "bad_files": bad_files,
        "formats": formats,
        "files": FILES_NAME,
        "seconds": round(seconds, 3),
    }
    os.replace(files_tmp, out_dir / FILES_NAME)
    atomic_write_text(out_dir / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_file_records(path: str | Path) -> list[dict[str, Any]]:
    """The per-file records of a prepared folder (``files.jsonl``: path, format, counts, replaced bytes)."""
    with open(Path(path) / FILES_NAME, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and check ``manifest.json`` of a prepared folder.

    Raises:
        InputFileError: no folder, no manifest (preparation never ran or did not finish), wrong version.
    """
    path = Path(path)
    if not path.is_dir():
        raise InputFileError(f"{path}: no such prepared corpus folder; {PREPARE_HINT.format(out=path)}")
    file = path / MANIFEST_NAME
    if not file.is_file():
        raise InputFileError(f"{path}: no {MANIFEST_NAME}, so this is not a prepared corpus (or its preparation "
                             f"did not finish); {PREPARE_HINT.format(out=path)}")
    try:
        manifest = json.loads(file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise InputFileError(f"{file}: not valid UTF-8 JSON ({str(err)[:120]}); prepare the corpus again") from None
    if not isinstance(manifest, dict):
        raise InputFileError(f"{file}: not a JSON object; prepare the corpus again")
    if manifest.get("format") != "lmforge-shards" or manifest.get("version") != FORMAT_VERSION:
        raise InputFileError(f"{file}: format {manifest.get('format')!r} version {manifest.get('version')!r} is "
                             f"not lmforge-shards version {FORMAT_VERSION}; prepare the corpus again")
    return manifest


# ---------------------------------------------------------------------------------------------------- reading
class _Shard:
    def __init__(self, folder: Path, entry: dict[str, int]) -> None:
        name = entry["name"]
        try:
            # np.asarray: plain ndarray views of the maps (still paged in lazily), without np.memmap's
            # per-slice overhead
            self.ids = np.asarray(np.load(folder / f"{name}.ids.npy", mmap_mode="r"))
            self.sent = np.asarray(np.load(folder / f"{name}.sent.npy", mmap_mode="r"))
            self.doc = np.asarray(np.load(folder / f"{name}.doc.npy"))  # small: one int per document
        except (OSError, ValueError, EOFError) as err:
            raise InputFileError(f"{folder}: shard {name} is missing or unreadable ({err}); prepare the corpus "
                                 "again") from err
        if (len(self.ids), len(self.sent), len(self.doc)) != (entry["tokens"], entry["sentences"],
                                                              entry["documents"]):
            raise InputFileError(f"{folder}: shard {name} does not match the manifest's counts; the folder was "
                                 "changed after preparation; prepare the corpus again")


class ShardedCorpus:
    """A prepared corpus: documents of sentences of token ids, read lazily from memory-mapped shards.

    Documents are numbered globally across shards (0 .. ``num_documents - 1``, in preparation order).

    Args:
        path: the prepared folder (``prepare_corpus``'s ``out_dir``).
        tokenizer: optional tokenizer (object or folder) the caller will use with the ids; when its hash differs
            from the one the shards were made with, a clear error says so.

    Raises:
        InputFileError: no folder or manifest, or a broken shard.
        LmforgeError: the tokenizer does not match the shards.
    """

    def __init__(self, path: str | Path, tokenizer: WordPieceTokenizer | str | Path | None = None) -> None:
        self.path = Path(path)
        self.manifest = load_manifest(self.path)
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)
        self._shards = [_Shard(self.path, entry) for entry in self.manifest["shards"]]
        if not self._shards or not self.manifest["counts"]["tokens"]:
            raise InputFileError(f"{self.path}: the prepared corpus is empty; prepare it from files with text")
        self._doc_starts = [0]  # global index of each shard's first document
        for shard in self._shards:
            self._doc_starts.append(self._doc_starts[-1] + len(shard.doc))
        lengths = []
        for shard in self._shards:
            ends = np.asarray(shard.sent)[shard.doc - 1]
            lengths.append(np.diff(ends, prepend=0))
        self._doc_lengths = np.concatenate(lengths).astype(np.int64)

    # ------------------------------------------------------------------ metadata
    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self.manifest["special_ids"])

    @property
    def num_documents(self) -> int:
        return self._doc_starts[-1]

    @property
    def num_sentences(self) -> int:
        return int(self.manifest["counts"]["sentences"])

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["counts"]["tokens"])

    def token_counts(self) -> np.ndarray:
        """How often each id occurs in the corpus: (vocab_size,) int64, counted shard by shard (memory: one shard)."""
        counts = np.zeros(self.vocab_size, dtype=np.int64)
        for shard in self._shards:
            found = np.bincount(shard.ids, minlength=self.vocab_size)
            counts += found[:self.vocab_size]
        return counts

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def document_lengths(self) -> np.ndarray:
        """(num_documents,) tokens per document (read-only)."""
        view = self._doc_lengths.view()
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return self.num_documents

    def __repr__(self) -> str:
        return (f"ShardedCorpus({str(self.path)!r}, documents={self.num_documents}, "
                f"sentences={self.num_sentences}, tokens={self.num_tokens}, shards={self.num_shards})")

    def check_tokenizer(self, tokenizer: WordPieceTokenizer | str | Path) -> None:
        """Raise ``LmforgeError`` naming both tokenizers when ``tokenizer`` is not the one the shards were made
        with."""
        given = str(tokenizer) if isinstance(tokenizer, str | Path) else "the given tokenizer"
        if isinstance(tokenizer, str | Path):
            tokenizer = WordPieceTokenizer.from_pretrained(tokenizer)
        expected = self.manifest["tokenizer"]
        actual = tokenizer_hash(tokenizer)
        if actual != expected["hash"]:
            raise LmforgeError(
                f"{self.path} was prepared with the tokenizer in {expected['path']} (hash {expected['hash'][:12]}), "
                f"but {given} (vocab_size {tokenizer.vocab_size}, hash {actual[:12]}) is a different one, so "
                f"the token ids would not match. Prepare the corpus again with this tokenizer (`lmforge data "
                f"prepare --tokenizer ... --overwrite`) or use the tokenizer in {expected['path']}")

    # ------------------------------------------------------------------ access
    def _locate(self, i: int) -> tuple[_Shard, int]:
        n = self.num_documents
        if not -n <= i < n:
            raise IndexError(f"document {i} is out of range (the corpus has {n} documents)")
        if i < 0:
            i += n
        s = bisect_right(self._doc_starts, i) - 1
        return self._shards[s], i - self._doc_starts[s]

    def _bounds(self, i: int) -> tuple[_Shard, int, int]:
        """The shard and the document's sentence range [s0, s1) in it."""
        shard, local = self._locate(int(i))
        s0 = int(shard.doc[local - 1]) if local else 0
        return shard, s0, int(shard.doc[local])

    def sentence_offsets(self, i: int) -> np.ndarray:
        """(n_sentences + 1,) int64 token offsets of document ``i``'s sentences, from 0 to its length."""
        shard, s0, s1 = self._bounds(i)
        base = int(shard.sent[s0 - 1]) if s0 else 0
        out = np.empty(s1 - s0 + 1, dtype=np.int64)
        out[0] = 0
        out[1:] = shard.sent[s0:s1]
        out[1:] -= base
        return out

    def document_tokens(self, i: int) -> np.ndarray:
        """All token ids of document ``i`` (a read-only view into the memory-mapped shard)."""
        shard, s0, s1 = self._bounds(i)
        start = int(shard.sent[s0 - 1]) if s0 else 0
        return shard.ids[start:int(shard.sent[s1 - 1])]

    def document(self, i: int) -> list[np.ndarray]:
        """The sentences of document ``i`` as arrays of token ids (read-only views)."""
        tokens = self.document_tokens(i)
        offsets = self.sentence_offsets(i)
        return [tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]

    def __getitem__(self, i: int) -> list[np.ndarray]:
        return self.document(i)

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        for i in range(self.num_documents):
            yield self.document(i)
