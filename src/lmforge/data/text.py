"""Reading plain-text corpora: files or folders of ``.txt``, decoded as UTF-8 with counted replacements."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.errors import InputFileError

log = logging.getLogger("lmforge")


def collect_text_files(paths: Iterable[str | Path], suffix: str = ".txt") -> list[Path]:
    """Expand files and folders (searched recursively for ``*.txt``) into a sorted, de-duplicated list.

    Raises:
        InputFileError: a path does not exist, or nothing readable was found.
    """
    files: list[Path] = []
    given = list(paths)
    if not given:
        raise InputFileError("no input given; pass one or more files or folders of .txt files")
    for p in map(Path, given):
        if p.is_dir():
            found = sorted(q for q in p.rglob(f"*{suffix}") if q.is_file())
            if not found:
                raise InputFileError(f"{p}: folder holds no {suffix} files; point at the files themselves "
                                     f"or a folder that contains {suffix} files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise InputFileError(f"{p}: no such file or folder; check the path")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def decode_utf8(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing each invalid byte sequence by U+FFFD.

    Returns:
        The text and the number of bytes that were replaced.
    """
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    parts: list[str] = []
    replaced = 0
    pos = 0
    while pos < len(data):
        try:
            parts.append(data[pos:].decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            parts.append(data[pos:pos + err.start].decode("utf-8"))
            parts.append("\ufffd")
            replaced += err.end - err.start
            pos += err.end
    return "".join(parts), replaced


@dataclass
class ReadStats:
    """What reading a corpus met: file and byte counts, and the files that were not valid UTF-8."""

    files: int = 0
    bytes: int = 0
    replaced_bytes: int = 0
    bad_files: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        s = f"{self.files} files, {self.bytes / 1e6:.2f} MB"
        if self.bad_files:
            s += (f"; {self.replaced_bytes} invalid UTF-8 bytes replaced by U+FFFD in "
                  f"{len(self.bad_files)} file(s)")
        return s


def read_texts(files: Iterable[Path], stats: ReadStats | None = None) -> Iterator[tuple[Path, str]]:
    """Yield ``(path, text)`` for each file, decoded as UTF-8 with replacement.

    A file that is not valid UTF-8 is read anyway (its bad bytes become U+FFFD, which BERT's cleaning then
    drops) and a warning names the file, the byte count and the fix.
    """
    for path in files:
        data = Path(path).read_bytes()
        text, replaced = decode_utf8(data)
        if stats is not None:
            stats.files += 1
            stats.bytes += len(data)
        if replaced:
            log.warning("%s: not valid UTF-8, %d byte(s) replaced by U+FFFD; re-save the file as UTF-8 "
                        "to keep those characters", path, replaced)
            if stats is not None:
                stats.replaced_bytes += replaced
                stats.bad_files[str(path)] = replaced
        yield Path(path), text
