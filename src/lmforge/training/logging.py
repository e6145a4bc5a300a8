"""What a run records: ``metrics.jsonl`` (one JSON object per line), optional TensorBoard events, the loss curve.

Training lines hold ``step``, ``epoch``, ``loss``, ``loss_<term>`` for every loss term, every objective metric
under its own name, ``lr``, ``grad_norm``, ``tokens_per_s``, ``tokens`` (seen so far) and ``elapsed_s``; losses,
metrics and the gradient norm are means over the steps since the previous line. Evaluation lines hold ``step`` and
the evaluation's values: ``eval_*`` keys computed on eval data, and a task evaluator's metrics under their plain
names (``accuracy``, ``f1``, ``exact_match``, ``rougeL``...); they have no ``loss`` and no ``lr``. TensorBoard
(``pip install tensorboard``) is imported only when asked for: training values go under ``train/``, evaluation
values under ``eval_`` names. ``loss_curve.png`` is ``lmforge viz training``'s figure (``lmforge.viz.plots``).
"""

from __future__ import annotations

import glob
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.utils.io import atomic_write_text

METRICS_NAME = "metrics.jsonl"
CURVE_NAME = "loss_curve.png"
TENSORBOARD_DIR = "tensorboard"


# Where a faster malloc may be installed (the distributions' library folders, /usr/local, the Python environment),
# and the file names that replace glibc's malloc when preloaded, tcmalloc first (the allocator we measured).
ALLOCATOR_DIRS: tuple[str, ...] = ("/usr/lib/*-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
                                   os.path.join(sys.prefix, "lib"))
ALLOCATOR_FILES = ("libtcmalloc.so*", "libtcmalloc_minimal.so*", "libjemalloc.so*")


def find_allocator() -> str | None:
    """The path of an installed tcmalloc or jemalloc shared library (tcmalloc first), or None when there is none."""
    for name in ALLOCATOR_FILES:
        found = sorted(path for folder in ALLOCATOR_DIRS for path in glob.glob(os.path.join(folder, name))
                       if os.path.isfile(path))
        # the runtime name (libtcmalloc.so.4) before the development link (libtcmalloc.so) and debug variants
        found.sort(key=lambda path: (".so." not in os.path.basename(path), len(os.path.basename(path))))
        if found:
            return found[0]
    return None


# glibc's own settings that keep freed memory for reuse: never map a block separately (each large tensor would be
# a fresh mapping whose pages fault in on every step), never hand the heap's top back (64 GiB threshold)
GLIBC_REUSE = "MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736"


# In-process tuning (mallopt, what those variables do at start-up): training commands apply it to their own process
# unless LMFORGE_GLIBC_TUNING=0. mallopt's value is a C int, so the trim threshold is 2 GiB - 1 rather than 64 GiB
# (a heap top of 2 GiB free is still kept; above that glibc may trim).
GLIBC_TUNING_ENV = "LMFORGE_GLIBC_TUNING"
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h parameter numbers
_TRIM_THRESHOLD = 2**31 - 1
_glibc_tuned = False


def _glibc_is_tuned() -> bool:
    return _glibc_tuned or "MALLOC_MMAP_MAX_" in os.environ or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")


def tune_glibc_malloc() -> str | None:
    """Make glibc malloc reuse freed memory in THIS process, as ``GLIBC_REUSE`` does when set before start-up:
    ``mallopt(M_MMAP_MAX, 0)`` (large tensors come from the heap instead of a fresh mapping each, whose pages fault in
    again on every step) and ``mallopt(M_TRIM_THRESHOLD, 2 GiB)`` (the heap's free top is kept). Returns the line to
    log the first time it applies; None when it does not apply (not Linux with glibc, tcmalloc or jemalloc
    preloaded, glibc already tuned by the environment, ``LMFORGE_GLIBC_TUNING=0``) or was applied already.
    The cost: the process keeps the memory of its peak step instead of returning it between steps."""
    global _glibc_tuned
    preload = os.environ.get("LD_PRELOAD", "")
    if (_glibc_is_tuned() or os.environ.get(GLIBC_TUNING_ENV, "1") == "0" or not sys.platform.startswith("linux")
            or "tcmalloc" in preload or "jemalloc" in preload or platform.libc_ver()[0] != "glibc"):
        return None
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) != 1:
        return None
    _glibc_tuned = True
    return (f"glibc malloc set to reuse freed memory in this process (M_MMAP_MAX=0, M_TRIM_THRESHOLD=2 GiB: fewer "
            f"page faults per step, the process keeps its peak memory); {GLIBC_TUNING_ENV}=0 keeps glibc's defaults")


def allocator_hint() -> str | None:
    """A hint for a faster allocator when training on CPU with glibc malloc: preload the tcmalloc (or jemalloc)
    library found on this machine; where none is installed, glibc's own ``GLIBC_REUSE`` settings (never a file that
    does not exist). None when an allocator is preloaded or glibc is tuned already, and off Linux/glibc.

    Measured on our 2-core CPU machines: a large share of each training step went to the kernel handing memory back
    to glibc malloc; preloading tcmalloc made the same training 1.17-1.44x faster, and ``GLIBC_REUSE`` made
    lmforge's bert-base / GPT-2 small pretraining steps 1.10x / 1.02x faster (Hugging Face's 1.18x / 1.27x).
    """
    preload = os.environ.get("LD_PRELOAD", "")
    if not sys.platform.startswith("linux") or "tcmalloc" in preload or "jemalloc" in preload:
        return None
    library = find_allocator()
    if library is None:
        if _glibc_is_tuned() or platform.libc_ver()[0] != "glibc":
            return None
        return ("training on CPU with glibc malloc, which maps large tensors afresh on every step; no tcmalloc or "
                f"jemalloc is installed, but starting the command with {GLIBC_REUSE} makes glibc reuse freed "
                "memory (1.02-1.10x measured; the process then keeps its peak memory)")
    name = "tcmalloc" if "tcmalloc" in os.path.basename(library) else "jemalloc"
    return (f"training on CPU with glibc malloc; preloading {name} usually speeds it up (tcmalloc: 1.2-1.4x "
            f"measured): LD_PRELOAD={library}")


def cpu_bf16_hint() -> str | None:
    """A warning when bf16 autocast would run on a CPU without native bf16 matrix instructions (None otherwise).

    Without AVX512_BF16 or AMX, oneDNN emulates bf16 matmuls: on an AVX2-only EPYC we measured a (4096 x 256) @
    (256 x 1024) matmul at 359 ms in bf16 against 48 ms in fp32.
    """
    from lmforge.utils.hardware import native_cpu_bf16

    if native_cpu_bf16() is not False:  # has it, or torch cannot tell
        return None
    return ("precision=bf16 on a CPU without AVX512_BF16 or AMX: bf16 matmuls are emulated and several times "
            "slower than fp32 here; use precision=fp32 on this machine")


def require_tensorboard() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or a clear error when the package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise LmforgeError("tensorboard = true needs the tensorboard package: pip install tensorboard "
                           "(or set train.tensorboard=false; metrics.jsonl is always written)") from err
    return SummaryWriter


class MetricsLog:
    """Appends records to ``out_dir/metrics.jsonl`` (and TensorBoard); a no-op when ``enabled`` is false.

    Args:
        out_dir: the run folder.
        enabled: false on every rank but 0.
        tensorboard: also write TensorBoard events to ``out_dir/tensorboard``.
        purge_step: on resume, TensorBoard drops events at and after this step (those of the interrupted run).
    """

    def __init__(self, out_dir: str | Path, *, enabled: bool = True, tensorboard: bool = False,
                 purge_step: int | None = None) -> None:
        self.path = Path(out_dir) / METRICS_NAME
        self.enabled = enabled
        self._file = None
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the whole run
            if tensorboard:
                self._tb = require_tensorboard()(log_dir=str(Path(out_dir) / TENSORBOARD_DIR), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()  # a killed run keeps every line written so far
        if self._tb is not None:
            step = record["step"]
            training = "loss" in record or "lr" in record  # evaluation lines have neither
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    name = f"train/{key}" if training else key if key.startswith("eval_") else f"eval_{key}"
                    self._tb.add_scalar(name, value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file: one JSON object per line. A torn last line (from a killed process),
    or any line that is not a JSON object, is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Drop the lines logged after ``last_step`` (by an interrupted run being resumed); returns how many."""
    path = Path(path)
    records = read_metrics(path)
    kept = [r for r in records if r.get("step", 0) <= last_step]
    if path.is_file() and (len(kept) != len(records) or not path.read_text(encoding="utf-8").endswith("\n")):
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return len(records) - len(kept)


def plot_loss_curve(records: list[dict[str, Any]], path: str | Path, *, title: str | None = None) -> bool:
    """Write the run's ``loss_curve.png``: the figure of ``lmforge viz training`` (train and dev loss, the learning
    rate on a secondary axis, a panel per dev metric), written atomically.

    Returns:
        False (and nothing is written) while the records hold nothing to draw yet.
    """
    from lmforge.viz.plots import plot_training, training_curves

    if training_curves(records).empty:
        return False
    plot_training(records, path, title=title if title is not None else Path(path).resolve().parent.name)
    return True
