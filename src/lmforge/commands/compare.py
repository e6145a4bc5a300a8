"""``lmforge compare --config FILE``: from scratch vs static vectors vs pretrain + fine-tune; the comparison
itself is ``lmforge.recipes.compare``."""

from __future__ import annotations

import argparse

from lmforge.config import load_toml
from lmforge.errors import LmforgeError


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="FILE", help="a TOML file (configs/compare-bbc.toml)")
    p.add_argument("--out", metavar="DIR", help="default: the config's out")
    p.add_argument("--sizes", type=_ints, metavar="N,N,...", help="examples per class (0 = all)")
    p.add_argument("--seeds", type=_ints, metavar="S,S,...",
                   help="seeds of each size: each draws the subset and initialises the model (default: the "
                        "config's seeds, 0,1,2)")
    p.add_argument("--only", metavar="NAME[,NAME]", action="append",
                   help="run only these approaches (by name; repeat the option, or separate names by commas; a "
                        "name that holds a comma is matched whole)")
    p.add_argument("--train", dest="data", metavar="FILE",
                   help="the labelled data (the config's data): a CSV/TSV/JSONL file, or bbc; its training split is "
                        "carved out of it, and its test split too unless --test names a file")
    p.add_argument("--test", dest="test_data", metavar="FILE",
                   help="a test file of its own (the config's test_data); without one, test_fraction of --train")
    p.add_argument("--pretrained", metavar="DIR", help="the model folder of the @pretrained approaches (default: the "
                                                        "config's pretrained)")
    p.add_argument("--resume", nargs="?", const="auto", default="never", choices=("auto", "never"),
                   metavar="auto|never", help="auto (also a bare --resume): continue the comparison in --out: "
                                              "finished runs are kept, the rest run; never: refuse a non-empty --out")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a non-empty --out (the old folder is "
                                                            "renamed, not deleted)")


def only_names(value: str, known: set[str]) -> list[str]:
    """The approach names in one ``--only`` value: split on commas, except where consecutive parts joined by their
    commas name a known approach ("bert-mini, no pretraining" is one name when the config has it; the longest such
    join wins). A part that names nothing is returned as given, for the caller to report."""
    parts, names, i = value.split(","), [], 0
    while i < len(parts):
        j = next((j for j in range(len(parts), i, -1) if ",".join(parts[i:j]).strip() in known), None)
        if j is None:
            names += [parts[i].strip()] if parts[i].strip() else []
            i += 1
        else:
            names.append(",".join(parts[i:j]).strip())
            i = j
    return names


def run_compare_command(args: argparse.Namespace) -> int:
    from lmforge.recipes.compare import compare_config, run_compare

    values = load_toml(args.config)
    for key in ("out", "sizes", "seeds", "pretrained", "data", "test_data"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.only:
        known = {a.get("name") for a in values.get("approach", [])}
        wanted = {name for value in args.only for name in only_names(value, known)}
        if wanted - known:
            raise LmforgeError(f"--only: unknown approach(es) {', '.join(sorted(wanted - known))}; the config has "
                               f"{', '.join(sorted(map(str, known)))}")
        values["approach"] = [a for a in values.get("approach", []) if a.get("name") in wanted]
    config = compare_config(values, args.config)
    paths = run_compare(config, resume=args.resume == "auto", overwrite=args.overwrite)
    print(paths["md"].read_text(encoding="utf-8"))
    print(f"table: {paths['md']}  csv: {paths['csv']}  learning curve: {paths['png']}")
    return 0
