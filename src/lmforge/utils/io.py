"""Small file helpers: atomic writes and refusing to overwrite a user's output."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from lmforge.errors import LmforgeError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one.

    The bytes go to a temporary file in the same folder, are flushed and fsync'ed, then renamed over the
    target (an atomic step on POSIX and Windows).
    """
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def check_can_write(path: str | Path, overwrite: bool, what: str = "output") -> None:
    """Refuse to replace an existing file, or a non-empty folder, unless ``overwrite`` is set."""
    path = Path(path)
    if overwrite or not path.exists():
        return
    if path.is_dir() and not any(path.iterdir()):
        return
    raise LmforgeError(f"{path}: {what} already exists; choose another path or pass --overwrite "
                       "(overwrite=True) to replace it")


def move_aside(path: str | Path) -> Path:
    """Rename ``path`` to ``<path>.old-<UTC timestamp>`` (a free name; nothing is deleted) and return the new name."""
    from datetime import UTC, datetime

    path = Path(path)
    stamp, n = datetime.now(UTC).strftime("%Y%m%d-%H%M%S"), 0
    aside = path.with_name(f"{path.name}.old-{stamp}")
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.old-{stamp}-{n}")
    path.rename(aside)
    return aside


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on success it replaces ``path`` atomically, on
    error it is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file owner-only; give it the mode open() would
    if "b" in mode:
        encoding = None
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
