"""BERT's ``vocab.txt``: one token per line, the token's id is its line number (counting from 0)."""

from __future__ import annotations

import io
from pathlib import Path

from lmforge.errors import InputFileError
from lmforge.utils.io import atomic_write_text


def load_vocab(path: str | Path) -> dict[str, int]:
    """Read a ``vocab.txt`` into ``{token: id}``.

    Raises:
        InputFileError: the file is missing, empty, or lists a token twice.
    """
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: vocabulary file not found; pass the folder or file that holds vocab.txt")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputFileError(f"{path}:{line}: not valid UTF-8 (byte {err.start}); a vocabulary file is UTF-8 text, "
                             "one token per line") from None
    vocab: dict[str, int] = {}
    for lineno, line in enumerate(io.StringIO(text, newline=None), start=1):  # lines as open() splits them
        token = line.rstrip("\n").rstrip("\r")
        if token in vocab:
            raise InputFileError(
                f"{path}:{lineno}: token {token!r} already appears on line {vocab[token] + 1}; "
                "each token must appear once (ids are line numbers)")
        vocab[token] = lineno - 1
    if not vocab:
        raise InputFileError(f"{path}: the vocabulary file is empty")
    return vocab


def save_vocab(tokens: list[str], path: str | Path) -> None:
    """Write tokens one per line, atomically (the id of a token is its line number)."""
    for t in tokens:
        if "\n" in t or "\r" in t:
            raise ValueError(f"token {t!r} contains a line break and cannot be stored in vocab.txt")
    atomic_write_text(path, "".join(t + "\n" for t in tokens))
