"""The word2vec vector formats of the C tool (Mikolov et al., 2013), text and binary, read and written.

Both start with a header line ``N D`` (vectors, dimensions). Text: then one line per word, the word and its D
values separated by single spaces. Binary: then per word the UTF-8 word, one space and D little-endian float32
(4 D bytes), followed by a newline in the C tool's files and in ours, and by nothing in gensim's; the reader
accepts both. Words cannot contain white space in either format.

Text values are written with 9 significant digits, enough to read back the exact float32. Files are written
atomically (``lmforge.utils.io.atomic_open``). Reading checks the header against the rows and names the file
and the line (text) or the vector's number and byte offset (binary) of the first disagreement.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from lmforge.embeddings.vectors import KeyedVectors
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import atomic_open

log = logging.getLogger("lmforge")

FORMATS = ("text", "binary")


def _check_words(kv: KeyedVectors) -> None:
    for word in kv.words:
        if not word or any(ch.isspace() for ch in word):
            raise LmforgeError(f"word {word!r} is empty or contains white space and cannot be written in the "
                               "word2vec format; remove or rename it")


def save_word2vec(kv: KeyedVectors, path: str | Path, binary: bool = False) -> None:
    """Write ``kv`` in the word2vec text (default) or binary format, atomically."""
    _check_words(kv)
    n, dim = kv.vectors.shape
    vectors = np.ascontiguousarray(kv.vectors, dtype="<f4")
    if binary:
        with atomic_open(path, "wb") as f:
            f.write(f"{n} {dim}\n".encode())
            for word, row in zip(kv.words, vectors, strict=True):
                f.write(word.encode("utf-8") + b" " + row.tobytes() + b"\n")
        return
    line = " ".join(["%.9g"] * dim)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(f"{n} {dim}\n")
        for word, row in zip(kv.words, vectors.tolist(), strict=True):
            f.write(f"{word} {line % tuple(row)}\n")


def _parse_header(path: Path, line: bytes) -> tuple[int, int]:
    parts = line.split()
    try:
        n, dim = (int(p) for p in parts)
    except ValueError:
        n = dim = -1
    if len(parts) != 2 or n < 0 or dim < 1:
        shown = line[:80].decode("utf-8", errors="replace").rstrip("\n")
        raise InputFileError(f"{path}, line 1: expected the header 'N D' (vectors, dimensions), got {shown!r}; "
                             "is this a word2vec file?")
    return n, dim


def _decode_word(path: Path, raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{path}, {where}: the word is not valid UTF-8 ({raw[:40]!r}); is the file "
                             "binary? then read it with binary=True (--binary)") from None


def load_word2vec(path: str | Path, binary: bool | None = None) -> KeyedVectors:
    """Read a word2vec text or binary file (``binary=None``: decided from the file's content).

    A word that repeats keeps its first vector (a warning names it), as in gensim.

    Raises:
        InputFileError: a missing file, a bad header, or rows that disagree with the header (too few or too many
            rows, a row with the wrong number of values, a value that is not a number), with the line number.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: no such file; check the path")
    data = path.read_bytes()
    end = data.find(b"\n")
    header = data if end < 0 else data[:end]
    n, dim = _parse_header(path, header)
    body = b"" if end < 0 else data[end + 1:]
    # every value takes at least one byte (4 in binary, a digit and a separator in text): a header that promises
    # far more than the file can hold fails here, before the (n, dim) table is allocated
    if n * max(dim, 1) > len(body):
        raise InputFileError(f"{path}, line 1: the header says {n:,} vectors of {dim:,} dimensions, more than the "
                             f"file's {len(body):,} bytes can hold; fix the header's counts or the truncated file")
    if binary is None:
        binary = _looks_binary(body, dim)
    words, vectors = (_read_binary if binary else _read_text)(path, body, n, dim)
    return _dedupe(path, words, vectors)


def _looks_binary(body: bytes, dim: int) -> bool:
    """A text row is valid UTF-8 and splits into 1 + D fields; a binary one almost never does."""
    first = body[:body.find(b"\n")] if b"\n" in body else body
    try:
        fields = first.decode("utf-8").rstrip("\r ").split(" ")
    except UnicodeDecodeError:
        return True
    return len(fields) != dim + 1


def _read_text(path: Path, body: bytes, n: int, dim: int) -> tuple[list[str], np.ndarray]:
    lines = body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    words: list[str] = []
    vectors = np.empty((n, dim), dtype=np.float32)
    for i, raw in enumerate(lines):
        line_no = i + 2
        if i >= n:
            extra = len([x for x in lines[i:] if x.strip()])
            if extra:
                raise InputFileError(f"{path}, line {line_no}: the header says {n} vectors but the file has "
                                     f"{extra} more row(s) from here; fix the header's count")
            break
        parts = raw.rstrip(b"\r").rstrip(b" ").split(b" ")
        if len(parts) != dim + 1:
            raise InputFileError(f"{path}, line {line_no}: {len(parts) - 1} values after the word, but the header "
                                 f"says {dim} dimensions")
        words.append(_decode_word(path, parts[0], f"line {line_no}"))
        try:
            vectors[i] = np.array(parts[1:], dtype=np.float32)
        except ValueError:
            raise InputFileError(f"{path}, line {line_no}: a value is not a number") from None
    if len(words) < n:
        raise InputFileError(f"{path}, line {len(lines) + 2}: the header says {n} vectors but the file ends after "
                             f"{len(words)}; fix the header's count or the truncated file")
    return words, vectors


def _read_binary(path: Path, body: bytes, n: int, dim: int) -> tuple[list[str], np.ndarray]:
    width = 4 * dim
    words: list[str] = []
    vectors = np.empty((n, dim), dtype=np.float32)
    pos, size = 0, len(body)
    for i in range(n):
        while pos < size and body[pos:pos + 1] in (b"\n", b"\r"):  # the C tool's newline after each vector
            pos += 1
        space = body.find(b" ", pos)
        where = f"vector {i + 1} (byte {pos} after the header)"
        if space < 0 or space + 1 + width > size:
            raise InputFileError(f"{path}, {where}: the header says {n} vectors of {dim} dimensions but the file "
                                 f"ends after {i}; fix the header or the truncated file")
        words.append(_decode_word(path, body[pos:space], where))
        vectors[i] = np.frombuffer(body, dtype="<f4", count=dim, offset=space + 1)
        pos = space + 1 + width
    rest = body[pos:].strip(b"\r\n")
    if rest:
        raise InputFileError(f"{path}, byte {pos} after the header: {len(rest)} bytes remain after the {n} vectors "
                             "that the header announces; fix the header's count")
    return words, vectors


def _dedupe(path: Path, words: list[str], vectors: np.ndarray) -> KeyedVectors:
    seen: dict[str, int] = {}
    keep: list[int] = []
    for i, w in enumerate(words):
        if w in seen:
            log.warning("%s: the word %r appears again in row %d; keeping its first vector", path, w, i + 1)
            continue
        seen[w] = i
        keep.append(i)
    if len(keep) < len(words):
        return KeyedVectors([words[i] for i in keep], vectors[keep])
    return KeyedVectors(words, vectors)
