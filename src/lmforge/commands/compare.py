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
    p.add_argument("--only", metavar="NAME[,NAME]", help="run only these approaches (by name)")
    p.add_argument("--pretrained", metavar="DIR", help="the model folder of the @pretrained approaches (default: the "
                                                        "config's pretrained)")
    p.add_argument("--resume", nargs="?", const="auto", default="never", choices=("auto", "never"),
                   metavar="auto|never", help="auto (also a bare --resume): continue the comparison in --out: "
                                              "finished runs are kept, the rest run; never: refuse a non-empty --out")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a non-empty --out (the old folder is "
                                                            "renamed, not deleted)")


def run_compare_command(args: argparse.Namespace) -> int:
    from lmforge.recipes.compare import compare_config, run_compare

    values = load_toml(args.config)
    for key in ("out", "sizes", "seeds", "pretrained"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    if args.only:
        wanted = {n.strip() for n in args.only.split(",")}
        known = {a.get("name") for a in values.get("approach", [])}
        if wanted - known:
            raise LmforgeError(f"--only: unknown approach(es) {', '.join(sorted(wanted - known))}; the config has "
                               f"{', '.join(sorted(map(str, known)))}")
        values["approach"] = [a for a in values.get("approach", []) if a.get("name") in wanted]
    config = compare_config(values, args.config)
    paths = run_compare(config, resume=args.resume == "auto", overwrite=args.overwrite)
    print(paths["md"].read_text(encoding="utf-8"))
    print(f"table: {paths['md']}  csv: {paths['csv']}  learning curve: {paths['png']}")
    return 0
