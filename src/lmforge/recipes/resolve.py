"""One way to turn what a user gave into a typed run config: a recipe's defaults, then a TOML file, then the plain
command-line flags, then dotted overrides (``--train.lr=3e-4``), each level over the one before."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from lmforge.config import apply_overrides, from_dict, load_toml, toml_literal
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge")

T = TypeVar("T")


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, table by table (neither is changed)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in top.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve(cls: type[T], *, defaults: dict[str, Any] | None = None, config: str | None = None,
            flags: dict[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = (),
            where: str = "config", normalize: Callable[[dict[str, Any], str], dict[str, Any]] | None = None) -> T:
    """Build ``cls`` from the levels above.

    Args:
        defaults: the recipe's own defaults (a nested dict, e.g. ``{"train": {"lr": 5e-5}}``).
        config: a TOML file.
        flags: ``{"train.lr": 3e-5, ...}`` from plain options; ``None`` values (not given) are skipped.
        overrides: ``["train.lr=3e-5", ...]`` (a leading ``--`` is allowed).
        where: names the source in error messages.
        normalize: rewrites the TOML values (an accepted older spelling into today's) before flags apply.

    Raises:
        LmforgeError: a bad file, an unknown key (listing the valid ones) or a bad value.
    """
    loaded = load_toml(config) if config else {}
    values = merge(defaults or {}, normalize(loaded, config or where) if normalize else loaded)
    settings = [f"{key}={toml_literal(value)}" for key, value in (flags or {}).items() if value is not None]
    return from_dict(cls, apply_overrides(values, settings + list(overrides)), where=config or where)


def split_model_table(values: dict[str, Any], where: str) -> dict[str, Any]:
    """One spelling for model settings everywhere: ``--model.d_model=128`` on the command line, a ``model`` table
    in TOML. Where ``model`` also names the starting weights (fine-tuning, comparison approaches) the table holds them
    as ``source``: ``model = { source = "bert-mini", d_model = 128 }`` becomes ``model = "bert-mini"`` and the
    preset overrides ``{d_model = 128}``. The older ``preset_options`` table is still read, with a warning.
    """
    out = dict(values)
    if "preset_options" in out:
        log.warning("%s: preset_options is deprecated; write model = { source = ..., d_model = ... } (or "
                    "--model.d_model=...)", where)
    model = out.get("model")
    if isinstance(model, dict):
        rest = dict(model)
        if not isinstance(rest.get("source"), str):
            raise LmforgeError(f"{where}: the model table needs source = \"DIR or preset\" beside its settings, e.g. "
                               "model = { source = \"bert-mini\", d_model = 128 }")
        out["model"] = rest.pop("source")
        out["preset_options"] = {**out.get("preset_options", {}), **rest}
    return out


def model_overrides(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """``--model.X=v`` overrides of a run whose ``model`` is a source path: the preset's settings
    (``preset_options.X=v``); ``--preset_options.X=v`` is still read, with a warning."""
    out = []
    for item in overrides:
        key = item[2:] if item.startswith("--") else item
        if key.startswith("preset_options."):
            log.warning("--%s is deprecated; write --model.%s", key.split("=", 1)[0], key.split("=", 1)[0][15:])
        out.append("preset_options." + key[len("model."):] if key.startswith("model.") else item)
    return out
