"""Fuzz sweep: every ``lmforge`` command on generated bad inputs (issue 14, item 8).

Every command (``lmforge.cli.COMMANDS``) runs in this process on small valid inputs with one thing broken: a
missing, empty, binary or wrongly typed input, a malformed CSV/CoNLL/JSONL/TOML/word2vec file, a broken model
folder (config.json variants, weights, vocab.txt, the head), an existing or misplaced output, a read-only or full
output folder (simulated at the OS boundary, and a real 64 KiB tmpfs where ``mount`` is allowed), every numeric
option at 0, -1, nan, +-inf, 1e30, huge integers and its declared bounds, unknown or missing options. Each case
must exit 2 with one ``lmforge: error:`` line, print no traceback, and leave every file that existed before
byte-identical. The cases and the checks are in ``tests/fuzz_cases.py``; ``tests/test_fuzz_cli.py`` runs the
fast subset (``--quick`` here runs that subset too).

    .venv/bin/python benchmarks/bench_fuzz.py [--quick] [-k PATTERN] [--budget 60] [--keep DIR]

Prints a table of outcomes per command, then every case that is not clean, grouped by cause, with its command
line (run in the case folder: inputs in ``in/``, outputs in ``out/``) and the first/last lines of its stderr or
the exception that escaped. Writes ``benchmarks/results/fuzz.json`` (every case, its outcome and output). Exit
code 0 whatever the findings (this is a report); 1 only if the harness itself fails.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # for tests.fuzz_cases

from common import machine_description, markdown_table, print_machine, reproduce_command  # noqa: E402

RESULTS = HERE / "results" / "fuzz.json"
COLUMNS = ("tried", "clean errors", "of which multi-line", "accepted (legit)", "tracebacks", "silent successes",
           "other (unclean/timeout/guard)", "files changed", "leftovers", "skipped")


def counts(results) -> dict[str, int]:
    c = Counter(r.outcome for r in results)
    return {"tried": len(results), "clean errors": c["clean"] + c["multi-line"], "of which multi-line": c["multi-line"],
            "accepted (legit)": c["accepted"], "tracebacks": c["traceback"], "silent successes": c["silent"],
            "other (unclean/timeout/guard)": c["unclean"] + c["timeout"] + c["guard"],
            "files changed": sum(1 for r in results if r.changed),
            "leftovers": sum(1 for r in results if r.leftovers), "skipped": c["skipped"]}


def cause(r) -> str:
    """The group a failing case is listed under: what to fix."""
    if r.outcome == "traceback":
        if r.where:
            return f"traceback: {r.exception.split(':', 1)[0]} at {r.where}"
        return f"traceback: {r.problem}"
    if r.outcome == "silent":
        return f"silent success (exit 0 on a bad input): {r.kind} cases"
    if r.outcome in ("timeout", "guard"):
        return f"{r.outcome}: {re.sub(r'[0-9]+', 'N', r.problem)}"
    if r.outcome == "unclean":
        return f"unclean error: {re.sub(r'[0-9]+', 'N', r.problem)}"
    if r.outcome == "accepted" and not r.may_succeed:
        return "accepted"
    return ""


def print_case(r) -> None:
    print(f"- `{r.id}`{' (fast subset)' if r.fast else ''}: `{r.command_line}`")
    if r.exception:
        print(f"  - exception: `{r.exception}`" + (f" at `{r.where}`" if r.where else ""))
    if r.outcome != "traceback" or not r.exception:
        lines = r.stderr_summary(1).splitlines()
        shown = "  /  ".join(line[:300] for line in lines) if lines else "(no stderr)"
        print(f"  - exit {r.rc}; stderr: `{shown}`")
    if r.changed:
        print(f"  - files changed: {', '.join(r.changed)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the fast subset (tests/test_fuzz_cli.py's cases)")
    parser.add_argument("-k", dest="pattern", help="only the cases whose id matches this regular expression")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds a case may run (default 60)")
    parser.add_argument("--keep", metavar="DIR", help="keep every case folder under DIR (default: deleted)")
    parser.add_argument("--json", default=str(RESULTS), help=f"where to write the results (default {RESULTS})")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)  # tiny models: one thread is fastest, as in tests/conftest.py
    from tests.fuzz_cases import all_cases, build_fixtures, run_case, tmpfs_available

    cases = all_cases()
    if args.quick:
        cases = [c for c in cases if c.fast]
    if args.pattern:
        cases = [c for c in cases if re.search(args.pattern, c.id)]
    argv = [a for a in sys.argv[1:]]
    print("# Fuzz sweep: every lmforge command on bad inputs\n")
    print(f"Reproduce: `{reproduce_command(__file__, argv)}`  ")
    print("One case: `.venv/bin/python benchmarks/bench_fuzz.py -k '^CASE-ID$' --keep /tmp/fuzz` (its folder is "
          "kept), or `LMFORGE_FUZZ_SWEEP=1 .venv/bin/python -m pytest tests/test_fuzz_cli.py -k 'CASE-ID'`\n")
    machine = machine_description()
    print_machine(machine)
    print(f"- tmpfs cases: {'a real 64 KiB tmpfs' if tmpfs_available() else 'skipped (mount not allowed)'}")
    print(f"- cases: {len(cases)}{' (--quick: the fast subset)' if args.quick else ''}\n", flush=True)

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lmforge-fuzz-"))
    root.mkdir(parents=True, exist_ok=True)
    results = []
    start = time.perf_counter()
    try:
        fixtures = build_fixtures(root / "_fixtures")
        print(f"fixtures built in {time.perf_counter() - start:.1f} s\n", flush=True)
        for i, case in enumerate(cases, 1):
            folder = root / case.id
            if folder.exists():
                shutil.rmtree(folder)
            results.append(run_case(case, fixtures, folder, budget_s=args.budget))
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
            if i % 50 == 0 or i == len(cases):
                bad = sum(1 for r in results if not r.ok)
                print(f"[{i}/{len(cases)}] {time.perf_counter() - start:.0f} s, {bad} not clean so far",
                      file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"\ninterrupted after {len(results)} cases; reporting those\n")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    seconds = time.perf_counter() - start

    # ------------------------------------------------------------------ the table
    by_command: dict[str, list] = defaultdict(list)
    for r in results:
        by_command[r.command].append(r)
    rows = [[f"`{name}`", *counts(rs).values()] for name, rs in by_command.items()]
    total = counts(results)
    rows.append(["**all**", *(f"**{v}**" for v in total.values())])
    print(f"## Outcomes ({len(results)} cases in {seconds:.0f} s)\n")
    print("Goal: tracebacks, silent successes, other and files changed all 0. *clean errors* count the argparse "
          "two-line form (*multi-line*) too; *accepted* are legitimate values (e.g. `--seed 0`) that ran.\n")
    print(markdown_table(["command", *COLUMNS], rows))

    # ------------------------------------------------------------------ the failing cases, grouped
    groups: dict[str, list] = defaultdict(list)
    for r in results:
        key = cause(r)
        if key and key != "accepted":
            groups[key].append(r)
        if r.changed:
            groups[f"files changed ({r.outcome})"].append(r)
    print(f"\n## Cases that are not clean ({sum(1 for r in results if not r.ok)}), by cause\n")
    if not groups:
        print("None.")
    order = ("traceback", "files changed", "silent", "unclean", "timeout", "guard")
    for key in sorted(groups, key=lambda k: (next((i for i, o in enumerate(order) if k.startswith(o)), 9), k)):
        print(f"\n### {key} ({len(groups[key])})\n")
        for r in groups[key]:
            print_case(r)
    leftovers = [r for r in results if r.leftovers]
    if leftovers:
        print(f"\n## Failed cases that left files behind ({len(leftovers)}; temporary names excepted)\n")
        for r in leftovers:
            print(f"- `{r.id}`: {', '.join(r.leftovers[:5])}{' ...' if len(r.leftovers) > 5 else ''}")
    skipped = [r for r in results if r.outcome == "skipped"]
    if skipped:
        print(f"\n{len(skipped)} cases skipped: {skipped[0].problem}")

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    head = json.dumps({"command": reproduce_command(__file__, argv), "machine": machine, "seconds": round(seconds, 1),
                       "counts": total, "by_command": {name: counts(rs) for name, rs in by_command.items()}},
                      indent=1)
    # one line per case: small, diffable; the temporary folder's path is written as <root>
    cases = ",\n  ".join(json.dumps(r.to_json()).replace(str(root), "<root>") for r in results)
    out.write_text(head[:-2] + f',\n "cases": [\n  {cases}\n ]\n}}\n', encoding="utf-8")
    print(f"\nwrote {out.relative_to(HERE.parent) if out.is_relative_to(HERE.parent) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
