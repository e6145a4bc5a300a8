"""Run every ``benchmarks/bench_*.py`` in turn, each in its own process with this interpreter (``make bench``).

New benchmarks are picked up by their file name; each must accept ``--quick`` (a short smoke-test run).
Their Markdown output goes straight to stdout; a summary of exit codes and durations ends the run, and the
exit code is 1 if any benchmark failed.

    .venv/bin/python benchmarks/run_all.py             # all benchmarks, full size
    .venv/bin/python benchmarks/run_all.py --quick     # all, small inputs
    .venv/bin/python benchmarks/run_all.py -k tokenizer
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover(pattern: str | None = None) -> list[Path]:
    """The benchmark scripts, sorted by name, optionally only those whose name contains ``pattern``."""
    return [p for p in sorted(HERE.glob("bench_*.py")) if pattern is None or pattern in p.stem]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run every benchmarks/bench_*.py in turn.")
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("-k", dest="pattern", help="only the benchmarks whose file name contains this text")
    args = p.parse_args(argv)
    scripts = discover(args.pattern)
    if not scripts:
        print(f"no benchmarks/bench_*.py matches {args.pattern!r}", file=sys.stderr)
        return 1
    results: list[tuple[str, int, float]] = []
    for script in scripts:
        print(f"\n<!-- {script.name} -->\n", flush=True)
        start = time.perf_counter()
        cmd = [sys.executable, str(script), *(["--quick"] if args.quick else [])]
        code = subprocess.run(cmd, cwd=HERE.parent, check=False).returncode
        results.append((script.name, code, time.perf_counter() - start))
    print("\n<!-- summary -->\n", flush=True)
    for name, code, seconds in results:
        print(f"- {name}: {'ok' if code == 0 else f'FAILED (exit code {code})'}, {seconds:.0f} s")
    return 0 if all(code == 0 for _, code, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
