"""Small file helpers: atomic writes, and the one policy by which every command treats its outputs."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")


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


# ------------------------------------------------------------------------------------------- the output policy
# Every command that writes follows these rules (README, "Your files are safe"):
# - a new run or output goes into an absent or empty folder, or to an absent file;
# - anything already there is refused, naming --overwrite (and --resume auto where the command can continue);
# - --overwrite moves an old folder aside to <name>.old-<UTC time> (nothing is deleted) and replaces a file
#   atomically;
# - an output equal to, inside, or holding one of the command's inputs is always refused.


def _describe(path: Path) -> str:
    entries = sorted(p.name for p in path.iterdir())
    shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
    return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}: {shown}"


def check_not_input(out: str | Path, inputs: Iterable[str | Path | None], option: str = "--out") -> None:
    """Refuse an output that is one of the inputs, lies inside an input folder, or holds an input.

    Raises:
        LmforgeError: naming the option, the input and the fix.
    """
    out_resolved = Path(out).resolve()
    for given in inputs:
        if not given:
            continue
        inp = Path(given).resolve()
        if out_resolved == inp:
            relation = "is"
        elif out_resolved.is_relative_to(inp) and inp.is_dir():
            relation = "is inside"
        elif inp.is_relative_to(out_resolved):
            relation = "holds"
        else:
            continue
        raise LmforgeError(f"{option} {out} {relation} the input {given}; lmforge never writes over its inputs: "
                           f"choose another {option}")


def prepare_output_dir(path: str | Path, *, overwrite: bool = False, inputs: Iterable[str | Path | None] = (),
                       option: str = "--out", continue_run: bool = False, resumable: bool = False,
                       create: bool = True) -> Path:
    """Make ``path`` ready to receive a new output folder, by the policy above, and return it.

    Args:
        overwrite: move a non-empty folder aside (``<name>.old-<UTC time>``) and start afresh.
        inputs: the command's inputs (files or folders), which the output may not be, be inside, or hold.
        option: the option that named the folder, for the messages.
        continue_run: the caller continues what is in the folder (``--resume``): a non-empty folder is kept.
        resumable: the command can continue an interrupted run (its refusal names ``--resume auto``).
        create: make the folder now (``False`` when ``staged_output_dir`` will put it in place at the end).

    Raises:
        LmforgeError: ``path`` is a file, is an input, or holds anything and neither flag allows it.
    """
    path = Path(path)
    check_output_dir(path, overwrite=overwrite, inputs=inputs, option=option, continue_run=continue_run,
                     resumable=resumable)
    if path.is_dir() and any(path.iterdir()) and not continue_run:  # and overwrite, or the check had refused
        log.warning("moved the previous contents of %s to %s", path, move_aside(path))
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LmforgeError(f"{option} {path}: a parent of the folder is a file; choose another path") from None
    return path


def _file_above(folder: Path) -> Path | None:
    """The nearest existing path at or above ``folder`` when it is a file (so no folder can be made there)."""
    for p in (folder, *folder.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def check_output_dir(path: str | Path, *, overwrite: bool = False, inputs: Iterable[str | Path | None] = (),
                     option: str = "--out", continue_run: bool = False, resumable: bool = False) -> None:
    """The checks of ``prepare_output_dir`` alone: raise where it would refuse, change nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise LmforgeError(f"{option} {path}: is a file, but {option} names a folder; choose a folder path")
    if _file_above(path.parent) is not None:
        raise LmforgeError(f"{option} {path}: a parent of the folder is a file; choose another path")
    check_not_input(path, inputs, option)
    if path.is_dir() and any(path.iterdir()) and not continue_run and not overwrite:
        resume = " or --resume auto to continue the run there," if resumable else ""
        raise LmforgeError(f"{option} {path} is not empty ({_describe(path)}); lmforge writes only into an "
                           f"empty or new folder: choose another {option}, pass{resume} --overwrite to move "
                           f"the old folder aside ({path.name}.old-<time>; nothing is deleted)")


def prepare_output_file(path: str | Path, *, overwrite: bool = False, inputs: Iterable[str | Path | None] = (),
                        option: str = "--out") -> Path:
    """Check that ``path`` may receive a new output file (absent, or ``overwrite``); create its parent folder.

    The file itself is written later with ``atomic_open`` / ``atomic_write_*``, so a failure leaves the old file.

    Raises:
        LmforgeError: ``path`` is a folder, is an input, exists without ``overwrite``, or its parent is a file.
    """
    path = Path(path)
    if path.is_dir():
        raise LmforgeError(f"{option} {path}: is a folder, but {option} names a file; give a file path")
    check_not_input(path, inputs, option)
    if path.exists() and not overwrite:
        raise LmforgeError(f"{option} {path}: the file already exists; choose another path or pass --overwrite "
                           "to replace it")
    parent = path.parent
    blocking = _file_above(parent)
    if blocking is not None:
        raise LmforgeError(f"{option} {path}: {blocking} is a file, not a folder; choose another path")
    parent.mkdir(parents=True, exist_ok=True)
    return path


PARTIAL_TAG = ".partial-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stale_partials(path: str | Path) -> list[Path]:
    """Remove ``.<name>.partial-<pid>`` folders beside ``path`` left by runs that were killed; return them."""
    path = Path(path)
    removed = []
    if not path.parent.is_dir():
        return removed
    for child in path.parent.glob(f".{path.name}{PARTIAL_TAG}*"):
        pid = child.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


@contextlib.contextmanager
def staged_output_dir(path: str | Path) -> Iterator[Path]:
    """Build an output folder under a temporary name beside ``path`` and rename it to ``path`` on success.

    An interrupted or failed run leaves no ``path`` (only, after a kill -9, a hidden ``.<name>.partial-<pid>``
    folder, which the next run removes, saying so). ``path`` itself must be absent or empty (see
    ``prepare_output_dir``).
    """
    path = Path(path)
    for stale in remove_stale_partials(path):
        log.warning("removed %s, left by an interrupted run", stale)
    tmp = path.with_name(f".{path.name}{PARTIAL_TAG}{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if path.is_dir():
            path.rmdir()  # empty by contract; a non-empty one makes this fail rather than lose anything
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def describe_os_error(err: OSError) -> str:
    """One line for an OSError met while reading or writing: the path, the cause and what to do."""
    path = err.filename or "a file"
    if err.filename2:
        path = f"{path} -> {err.filename2}"
    cause = err.strerror or str(err)
    hint = {errno.ENOSPC: "free some space or write to another disk",
            errno.EDQUOT: "free some space or write to another disk",
            errno.EROFS: "the file system is read-only; write to another folder",
            errno.EACCES: "no permission; write to a folder you own",
            errno.EPERM: "no permission; write to a folder you own",
            errno.EISDIR: "a folder is where a file was expected; give a file path",
            errno.ENOTDIR: "a file is where a folder was expected; check the path",
            errno.ENOENT: "check the path",
            errno.EEXIST: "it already exists; choose another path",
            errno.ENAMETOOLONG: "use a shorter path"}.get(err.errno or 0)
    return f"{path}: {cause}" + (f"; {hint}" if hint else "")
