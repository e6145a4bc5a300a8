"""One way to turn what a user gave into a typed run config: a recipe's defaults, then a TOML file, then the plain
command-line flags, then dotted overrides (``--train.lr=3e-4``), each level over the one before."""

from __future__ import annotations

from typing import Any, TypeVar

from lmforge.config import apply_overrides, from_dict, load_toml, toml_literal

T = TypeVar("T")


def merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, table by table (neither is changed)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in top.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve(cls: type[T], *, defaults: dict[str, Any] | None = None, config: str | None = None,
            flags: dict[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = (),
            where: str = "config") -> T:
    """Build ``cls`` from the levels above.

    Args:
        defaults: the recipe's own defaults (a nested dict, e.g. ``{"train": {"lr": 5e-5}}``).
        config: a TOML file.
        flags: ``{"train.lr": 3e-5, ...}`` from plain options; ``None`` values (not given) are skipped.
        overrides: ``["train.lr=3e-5", ...]`` (a leading ``--`` is allowed).
        where: names the source in error messages.

    Raises:
        LmforgeError: a bad file, an unknown key (listing the valid ones) or a bad value.
    """
    values = merge(defaults or {}, load_toml(config) if config else {})
    settings = [f"{key}={toml_literal(value)}" for key, value in (flags or {}).items() if value is not None]
    return from_dict(cls, apply_overrides(values, settings + list(overrides)), where=config or where)
