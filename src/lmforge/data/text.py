"""Reading plain-text corpora: files or folders of ``.txt``, decoded as UTF-8 with counted replacements."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lmforge.errors import InputFileError

log = logging.getLogger("lmforge")

# Whether invalid UTF-8 in the user's text is refused (``lmforge --strict-utf8``) instead of replaced with a
# warning. A context variable, set for the length of one command by ``strict_utf8``, so that every reader follows
# the same rule without a flag threaded through each call.
_STRICT_UTF8: contextvars.ContextVar[bool] = contextvars.ContextVar("lmforge_strict_utf8", default=False)


@contextlib.contextmanager
def strict_utf8(enabled: bool = True) -> Iterator[None]:
    """Within the block, text readers refuse invalid UTF-8 (``InputFileError`` naming file and line)."""
    token = _STRICT_UTF8.set(enabled)
    try:
        yield
    finally:
        _STRICT_UTF8.reset(token)


def strict_utf8_enabled() -> bool:
    """Whether the current command runs under ``--strict-utf8``."""
    return _STRICT_UTF8.get()


def require_file(path: str | Path, what: str = "file") -> Path:
    """``path`` as a Path when it is a readable file; else a clear error: missing, or a folder."""
    path = Path(path)
    if path.is_dir():
        raise InputFileError(f"{path}: is a folder, not a {what}; give the {what} itself")
    if not path.is_file():
        raise InputFileError(f"{path}: no such {what}; check the path")
    return path


_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\v\f\r\x1b")


def check_not_binary(data: bytes, path: str | Path) -> None:
    """Refuse a file that looks binary: NUL bytes among many control bytes in its first 64 KB (random bytes, an
    archive, UTF-16). Read as text, such a file gives errors about something else (an alphabet too large for the
    vocabulary, a malformed line). A stray NUL in real text is not refused (BERT's cleaning drops it)."""
    sample = data[:1 << 16]
    at = sample.find(b"\x00")
    if at < 0:
        return
    control = len(sample) - len(sample.translate(None, _CONTROL))
    if control >= 8 and control >= 0.01 * len(sample):
        line = data.count(b"\n", 0, at) + 1
        raise InputFileError(f"{path}:{line}: this looks like a binary file, not text ({control} control bytes, a NUL "
                             f"at offset {at}); give a UTF-8 text file")


def decode_user_text(data: bytes, path: str | Path, *, bom: bool = True) -> str:
    """Decode a user's file by the one UTF-8 rule of every command.

    Invalid byte sequences are replaced by U+FFFD and a warning names the file, the count and the first bad line;
    under ``strict_utf8()`` (``--strict-utf8``) they are refused instead. A UTF-8 byte-order mark is dropped.
    """
    if bom and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    check_not_binary(data, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        if _STRICT_UTF8.get():
            raise InputFileError(f"{path}:{line}: not valid UTF-8 (byte {err.start}: {err.reason}); save the file "
                                 "as UTF-8 (e.g. `iconv -f latin1 -t utf-8`), or drop --strict-utf8 to replace the "
                                 "bad bytes") from None
        text, replaced = decode_utf8(data)
        log.warning("%s: not valid UTF-8 (first at line %d), %d byte(s) replaced by U+FFFD; re-save the file as "
                    "UTF-8 to keep those characters (--strict-utf8 refuses such files)", path, line, replaced)
        return text


def read_user_text(path: str | Path, what: str = "file") -> str:
    """The text of one user file: ``require_file`` then ``decode_user_text``."""
    path = require_file(path, what)
    return decode_user_text(path.read_bytes(), path)


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
        check_not_binary(data, path)
        if _STRICT_UTF8.get():
            decode_user_text(data, path, bom=False)  # raises on the first invalid byte
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
