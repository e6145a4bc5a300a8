"""The generic machinery of every config: strict ``from_dict`` / ``to_dict``, type coercion, TOML loading and dotted
``section.key=value`` overrides.

A config is a dataclass that validates itself in ``__post_init__``. ``from_dict`` builds one strictly: an unknown key
is an error that lists the valid ones, so a typo never silently falls back to a default. A class may choose the
concrete dataclass from the values themselves (``ModelConfig`` picks its family's class by ``arch``) through a
``_resolve(values, where)`` class method.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from lmforge.errors import InputFileError, LmforgeError

T = TypeVar("T")


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass (nested ones included) as plain JSON/TOML-ready values."""
    return dataclasses.asdict(obj)


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except LmforgeError as err:
                errors.append(str(err))
        raise LmforgeError(errors[0] if errors else f"{where}: bad value {value!r}")
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise LmforgeError(f"{where}: expected a table of settings, got {value!r}")
        return from_dict(annotation, value, where=where)
    if origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, list | tuple):
            raise LmforgeError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(annotation)[:1] or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if annotation is Any:
        return value
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise LmforgeError(f"{where}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise LmforgeError(f"{where}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise LmforgeError(f"{where}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise LmforgeError(f"{where}: expected a string, got {value!r}")
    if origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise LmforgeError(f"{where}: expected a table, got {value!r}")
    return value


def coerce(value: Any, annotation: Any, where: str) -> Any:
    """``value`` checked and converted to the type ``annotation`` (a dataclass, list, optional, literal ...), with
    errors naming ``where``: the one conversion used by configs, head options and Hugging Face configs."""
    return _coerce(value, annotation, where)


def from_dict(cls: type[T], values: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from ``values`` strictly: unknown keys and wrong types are errors.

    A class with a ``_resolve(values, where)`` class method (``ModelConfig``) names the concrete class first: the
    valid keys are then that class's, and ``_unknown_hint(keys)`` may say where an unknown key belongs instead. A
    class with ``_upgrade_values(values, where)`` rewrites settings that moved since an older release first.
    """
    resolve = getattr(cls, "_resolve", None)
    if resolve is not None:
        cls = resolve(values, where)
    upgrade = getattr(cls, "_upgrade_values", None)  # settings an older release wrote, moved since
    if upgrade is not None and isinstance(values, dict):
        values = upgrade(values, where)
    hints = _field_types(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown = [k for k in values if k not in names]
    if unknown:
        hint = getattr(cls, "_unknown_hint", lambda keys: "")(unknown)
        label = getattr(cls, "_keys_label", lambda: "")()
        raise LmforgeError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys{label} are "
                           f"{', '.join(names)}{hint}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}
    return cls(**kwargs)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: {'a folder, not a TOML file' if path.is_dir() else 'config file not found'}")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise InputFileError(f"{path}: not UTF-8 text (bad byte at offset {err.start}); a config file is TOML "
                             "saved as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise InputFileError(f"{path}: not valid TOML ({err})") from err
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise InputFileError(f"{path}: not valid TOML (nested too deeply)") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise LmforgeError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().lstrip("-").split(".") if p]
    if not path:
        raise LmforgeError(f"override {text!r} has no key before '='")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def toml_literal(value: Any) -> str:
    """``value`` written as a TOML literal, for building ``key=value`` overrides from plain flags."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value).lower() if isinstance(value, bool) else repr(value)


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a nested dict (a copy); the dataclass check later rejects unknown keys."""
    out = _deep_copy(values)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise LmforgeError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return out


def _deep_copy(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in values.items()}
