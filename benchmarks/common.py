"""Helpers shared by the benchmarks: machine description, timing, memory, Markdown tables, subprocess results.

Every ``bench_*.py`` prints Markdown (tables, the command that reproduces it, the machine) so that its output
can be pasted into BENCHMARKS.md as is. Measurements that need a fresh process (peak memory, environment
variables read once at start-up) run the same script again in a child and read one ``RESULT`` JSON line.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULT_MARKER = "RESULT "


# ---------------------------------------------------------------------------------------------- machine
def cpu_model() -> str:
    """The CPU's ``model name`` from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_features() -> str:
    """The widest x86 vector extensions the CPU reports (``AVX-512``, ``AVX2``...), or ``""`` if unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ""
    if "avx512f" in flags:
        return "AVX-512" + (" + AVX512_BF16" if "avx512_bf16" in flags else "")
    if "avx2" in flags:
        return "AVX2, no AVX-512"
    return ""


def core_count() -> int:
    """Cores this process may run on (the affinity mask where available, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def package_version(name: str) -> str:
    """The installed version of a distribution, without importing it (``"not installed"`` if missing)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def allocator() -> str:
    """Which malloc this process uses: tcmalloc or jemalloc when preloaded (``LD_PRELOAD``), else glibc."""
    preload = os.environ.get("LD_PRELOAD", "")
    for name in ("tcmalloc", "jemalloc", "mimalloc"):
        if name in preload:
            return f"{name} (LD_PRELOAD)"
    try:  # linked in some other way (a wrapper script, a build option)
        with open("/proc/self/maps", encoding="utf-8") as f:
            maps = f.read()
        for name in ("tcmalloc", "jemalloc", "mimalloc"):
            if f"lib{name}" in maps:
                return f"{name} (linked)"
    except OSError:
        pass
    return "glibc malloc (no tcmalloc in LD_PRELOAD)"


def source_version() -> str:
    """The git commit of the checkout, and whether ``src/`` differs from it (read-only; never touches the index)."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "--no-optional-locks", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "not a git checkout"
    changes = git("status", "--porcelain", "--", "src").splitlines()
    if any(not line.startswith("??") for line in changes):
        return f"git {commit}, with uncommitted changes in src/"
    return f"git {commit}" + (", plus untracked files in src/" if changes else "")


def machine_description() -> dict[str, str]:
    """CPU, cores, software versions, allocator and load: what a reader needs to weigh the numbers."""
    features = cpu_features()
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return {
        "CPU": cpu_model() + (f" ({features})" if features else ""),
        "Cores": str(core_count()),
        "Python": platform.python_version(),
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "tokenizers": package_version("tokenizers"),
        "lmforge": f"{package_version('lmforge')} ({source_version()})",
        "Allocator": allocator(),
        "Load average (1, 5, 15 min) at start": load,
    }


def print_machine(description: dict[str, str] | None = None) -> None:
    """Print the machine description as a Markdown list."""
    for key, value in (description or machine_description()).items():
        print(f"- {key}: {value}")


def reproduce_command(script: str | Path, args: Sequence[str]) -> str:
    """The command line that reproduces this run, relative to the repository root (no absolute paths)."""
    exe = Path(sys.executable)
    try:
        interpreter = str(exe.relative_to(REPO_ROOT))
    except ValueError:
        interpreter = "python"
    try:
        script = Path(script).resolve().relative_to(REPO_ROOT)
    except ValueError:
        script = Path(script).name
    return shlex.join([interpreter, str(script), *args])


# ---------------------------------------------------------------------------------------------- measuring
def median_time(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> float:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times; return the median wall time in seconds."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_rss_mb() -> dict[str, float]:
    """This process's peak resident memory in MB (10^6 bytes), two ways.

    ``ru_maxrss`` is what ``getrusage(RUSAGE_SELF)`` reports. On Linux it survives ``execve``: a child started
    by a large parent starts with the parent's peak, so it over-states a small child. ``VmHWM`` (from
    /proc/self/status) is the high-water mark of the current address space only; it is the fair number
    when the two differ. Both are returned (``vm_hwm`` is absent where /proc is not available).
    """
    out = {"ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6}
    if sys.platform == "darwin":  # bytes there, not KiB
        out["ru_maxrss"] /= 1024
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    out["vm_hwm"] = int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return out


# ---------------------------------------------------------------------------------------------- children
def emit_result(result: dict[str, Any]) -> None:
    """Print a child's result as the one line its parent reads (see ``run_child``)."""
    print(RESULT_MARKER + json.dumps(result), flush=True)


def run_child(script: str | Path, args: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script`` with this interpreter in a fresh process and return the dict it passed to ``emit_result``.

    Its other output is dropped from stdout; stderr passes through. Raises ``RuntimeError`` if it fails.
    """
    proc = subprocess.run([sys.executable, str(script), *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {' '.join(args)} failed (exit code {proc.returncode}):\n{proc.stdout}")
    return json.loads(lines[-1][len(RESULT_MARKER):])


# ---------------------------------------------------------------------------------------------- output
def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one letter per column, ``l`` or ``r`` (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(x: float | None, digits: int = 2) -> str:
    """A number with ``digits`` decimals and thousands separators; ``"n/a"`` for ``None``."""
    return "n/a" if x is None else f"{x:,.{digits}f}"


def fmt_ratio(x: float | None) -> str:
    """A ratio such as ``3.20x``; ``"n/a"`` for ``None``."""
    return "n/a" if x is None else f"{x:.2f}x"
