"""Word vector files, read and written: the word2vec formats of the C tool (Mikolov et al., 2013), text and
binary, and GloVe's headerless text format (Pennington et al., 2014: the Stanford tool's output, and most published
vectors).

The word2vec formats start with a header line ``N D`` (vectors, dimensions). Text: then one line per word, the word
and its D values separated by single spaces. Binary: then per word the UTF-8 word, one space and D little-endian
float32 (4 D bytes), followed by a newline in the C tool's files and in ours, and by nothing in gensim's; the reader
accepts both. GloVe's format is word2vec's text format without the header line: the dimension is the number of
fields of the first line minus one, and every row must agree. Words cannot contain white space in any format.

Which format a file is in is decided from its content (``load_word2vec``): the first line is a word2vec header when
it is exactly two unsigned decimal integers (``3000000 300``); anything else starts a headerless GloVe file. The one
ambiguous case is a GloVe file of 1-dimensional vectors whose first word is a number and whose first value is an
integer (``2020 3``): it is read as a header (as gensim and the C tool would), and then fails with an error that says
so. ``save_word2vec(..., format="glove")`` never writes such a first row: it writes that value as ``3.0``.

Text values are written with 9 significant digits, enough to read back the exact float32. Files are written
atomically (``lmforge.utils.io.atomic_open``). Reading checks the header (or the first row) against the rows and
names the file and the line (text) or the vector's number and byte offset (binary) of the first disagreement.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from lmforge.embeddings.vectors import KeyedVectors
from lmforge.errors import InputFileError, LmforgeError
from lmforge.utils.io import atomic_open

log = logging.getLogger("lmforge")

FORMATS = ("text", "binary")
FILE_FORMATS = ("word2vec", "glove")  # save_word2vec's format=: with the 'N D' header line, or GloVe's without

_UNSIGNED = re.compile(rb"[0-9]+")


def _check_words(kv: KeyedVectors) -> None:
    for word in kv.words:
        if not word or any(ch.isspace() for ch in word):
            raise LmforgeError(f"word {word!r} is empty or contains white space and cannot be written in the "
                               "word2vec format; remove or rename it")


def save_word2vec(kv: KeyedVectors, path: str | Path, binary: bool = False, format: str = "word2vec") -> None:
    """Write ``kv`` atomically: the word2vec text (default) or binary format, or with ``format="glove"`` GloVe's
    headerless text format (text only)."""
    if format not in FILE_FORMATS:
        raise LmforgeError(f"format={format!r} is not one of {', '.join(FILE_FORMATS)}")
    if binary and format == "glove":
        raise LmforgeError("the GloVe format is text only: write it without binary=True (--binary), or write the "
                           "word2vec binary format (format='word2vec')")
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
        rows = zip(kv.words, vectors.tolist(), strict=True)
        if format == "word2vec":
            f.write(f"{n} {dim}\n")
        elif n:
            word, row = next(rows)
            first = f"{word} {line % tuple(row)}"
            if _is_header(first.encode("utf-8")):  # '2020 3' would read back as a header: write '2020 3.0'
                first += ".0"
            f.write(first + "\n")
        for word, row in rows:
            f.write(f"{word} {line % tuple(row)}\n")


def _is_header(line: bytes) -> bool:
    """The detection rule: a word2vec header is exactly two unsigned decimal integers."""
    parts = line.split()
    return len(parts) == 2 and all(_UNSIGNED.fullmatch(p) for p in parts)


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
    """Read a word2vec text or binary file, or a headerless GloVe text file (``binary=None``: the format decided
    from the file's content; see the module's notes for the rule).

    A word that repeats keeps its first vector (a warning names it), as in gensim.

    Raises:
        InputFileError: a missing file, a bad header, or rows that disagree with the header or, without one, with
            the first row (too few or too many rows, a row with the wrong number of values, a value that is not a
            number), with the line number.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: no such file; check the path")
    data = path.read_bytes()
    end = data.find(b"\n")
    header = data if end < 0 else data[:end]
    if not _is_header(header):
        if binary:
            raise InputFileError(f"{path}, line 1: a word2vec binary file starts with the header 'N D' (vectors, "
                                 f"dimensions), got {_shown(header)!r}; is this a text file? then read it without "
                                 "binary=True (--binary)")
        words, vectors = _read_glove(path, data)
        return _dedupe(path, words, vectors)
    n, dim = _parse_header(path, header)
    body = b"" if end < 0 else data[end + 1:]
    # every value takes at least one byte (4 in binary, a digit and a separator in text): a header that promises
    # far more than the file can hold fails here, before the (n, dim) table is allocated
    if n * max(dim, 1) > len(body):
        hint = ""
        second = body.split(b"\n", 1)[0].split()
        if len(second) in (0, 2):  # the next row (if any) is 'word value': a 1-dimensional GloVe file?
            hint = (f" (or is this a headerless GloVe file whose first row is the word {header.split()[0].decode()!r} "
                    "with one integer value? a first line of two integers is read as the word2vec header: write "
                    "that value with a decimal point, e.g. 3.0)")
        raise InputFileError(f"{path}, line 1: the header says {n:,} vectors of {dim:,} dimensions, more than the "
                             f"file's {len(body):,} bytes can hold; fix the header's counts or the truncated file"
                             f"{hint}")
    if binary is None:
        binary = _looks_binary(body, dim)
    words, vectors = (_read_binary if binary else _read_text)(path, body, n, dim)
    return _dedupe(path, words, vectors)


def _shown(line: bytes) -> str:
    return line[:80].decode("utf-8", errors="replace").rstrip("\r\n")


def _read_glove(path: Path, data: bytes) -> tuple[list[str], np.ndarray]:
    """A headerless GloVe text file: the first row sets the dimension, every row must agree."""
    lines = data.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputFileError(f"{path}, line 1: expected the header 'N D' (word2vec) or a row 'word v1 ... vD' "
                             "(GloVe), got an empty file")
    rows = [raw.rstrip(b"\r").rstrip(b" ") for raw in lines]
    try:
        rows[0].decode("utf-8")
    except UnicodeDecodeError:
        raise InputFileError(f"{path}, line 1: expected the header 'N D' (word2vec, text or binary) or a UTF-8 row "
                             "'word v1 ... vD' (GloVe), got bytes that are not UTF-8; is this a binary file "
                             "without its header?") from None
    dim = rows[0].count(b" ")
    if dim < 1:
        raise InputFileError(f"{path}, line 1: expected the header 'N D' (word2vec) or a row 'word v1 ... vD' "
                             f"(GloVe), got {_shown(rows[0])!r}")
    # check every row's field count first: the (rows, dim) table is allocated only for a file that can fill it
    for i, raw in enumerate(rows):
        if raw.count(b" ") != dim:
            raise InputFileError(f"{path}, line {i + 1}: {raw.count(b' ') if raw else 0} values after the word, but "
                                 f"line 1 has {dim} (a file without the 'N D' header is read as GloVe text, whose "
                                 "dimension is its first row's)")
    words: list[str] = []
    vectors = np.empty((len(rows), dim), dtype=np.float32)
    for i, raw in enumerate(rows):
        parts = raw.split(b" ")
        try:
            words.append(parts[0].decode("utf-8"))
        except UnicodeDecodeError:
            raise InputFileError(f"{path}, line {i + 1}: the word is not valid UTF-8 ({parts[0][:40]!r}); GloVe "
                                 "and word2vec text files are UTF-8") from None
        try:
            vectors[i] = np.array(parts[1:], dtype=np.float32)
        except ValueError:
            raise InputFileError(f"{path}, line {i + 1}: a value is not a number") from None
    return words, vectors


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
