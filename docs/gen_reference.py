"""Write the generated pages of the documentation site: the command-line reference (from the parser itself), the
benchmarks page (BENCHMARKS.md) and the Python API index (one mkdocstrings block per public module).

Run by ``make docs`` before ``mkdocs build``; the pages it writes are not committed (``.gitignore``).
"""

from __future__ import annotations

import argparse
import pkgutil
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Modules left out of the API reference: the command line's own wiring and C-extension helpers.
SKIP = re.compile(r"^lmforge\.(cli|__main__|commands\..*|nn\.kernels.*)$")


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=100, max_help_position=32)
    return parser.format_help()


def cli_page() -> str:
    from lmforge.cli import build_parser
    from lmforge.commands.vocabulary import walk

    parser = build_parser()
    out = ["# Command line", "",
           "Generated from the parser by `docs/gen_reference.py`: what `lmforge COMMAND --help` prints.", "",
           "```text", _usage(parser).rstrip(), "```", ""]
    for path, sub in walk(parser):
        out += [f"## lmforge {path}", "", "```text", _usage(sub).rstrip(), "```", ""]
    return "\n".join(out)


def api_page() -> str:
    import lmforge

    names = sorted(m.name for m in pkgutil.walk_packages(lmforge.__path__, "lmforge.") if not SKIP.match(m.name))
    out = ["# Python API", "", "Generated from the docstrings of every public module.", ""]
    for name in ["lmforge", *names]:
        out += [f"## `{name}`", "", f"::: {name}", "    options:", "      show_root_heading: false",
                "      members_order: source", "      show_submodules: false", ""]
    return "\n".join(out)


def benchmarks_page() -> str:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    # a link relative to the repository root names a file of the repository, not a page of this site: kept as text
    return re.sub(r"\[([^\]]+)\]\((?!https?://|#)[^)]+\)", r"\1", text)


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    reference = DOCS / "reference"
    reference.mkdir(exist_ok=True)
    (reference / "cli.md").write_text(cli_page(), encoding="utf-8")
    (reference / "api.md").write_text(api_page(), encoding="utf-8")
    (DOCS / "benchmarks.md").write_text(benchmarks_page(), encoding="utf-8")
    print(f"wrote {reference / 'cli.md'}, {reference / 'api.md'}, {DOCS / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
