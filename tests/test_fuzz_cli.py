"""Every ``lmforge`` command on generated bad inputs: a clean one-line error, exit code 2, no traceback, and every
file that existed before left byte-identical (issue 14, item 8). The cases live in ``tests/fuzz_cases.py``.

This runs the fast subset (a deterministic sample of every command x every mutation family). The whole sweep (all
mutations, every numeric option with 0, -1, nan, inf, 1e30, huge integers and its declared bounds) is
``benchmarks/bench_fuzz.py``, which prints a table of outcomes and the list of failing cases; or here with

    LMFORGE_FUZZ_SWEEP=1 .venv/bin/python -m pytest tests/test_fuzz_cli.py [-k generate]
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fuzz_cases import all_cases, build_fixtures, run_case, tmpfs_available

SWEEP = os.environ.get("LMFORGE_FUZZ_SWEEP", "") not in ("", "0")
CASES = [c for c in all_cases() if SWEEP or c.fast]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> dict[str, Path]:
    return build_fixtures(tmp_path_factory.mktemp("fuzz-fixtures"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_fails_cleanly(case, fixtures, tmp_path):
    if case.fault and case.fault.startswith("tmpfs") and not tmpfs_available():
        pytest.skip("mount -t tmpfs is not allowed here (needs root with CAP_SYS_ADMIN)")
    result = run_case(case, fixtures, tmp_path / "case", budget_s=60)
    if result.outcome == "skipped":
        pytest.skip(result.problem)
    if not result.ok:  # the command line, the exit code, the exception or the stderr; no repr of the Result
        pytest.fail(result.describe(), pytrace=False)
