"""Typed configuration: frozen dataclasses built from TOML, presets and ``key=value`` overrides.

A config is a (possibly nested) frozen dataclass whose ``__post_init__`` validates its
fields and raises :class:`~glassgpt.errors.ConfigError` naming the field. This module turns
plain dicts into such dataclasses, with type coercion and errors that carry the dotted path
of the offending key:

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Opt:
...     lr: float = 1e-3
...     steps: int = 10
>>> from_dict(Opt, {"lr": "3e-4"})
Opt(lr=0.0003, steps=10)
>>> from_dict(Opt, {"step": 5})
Traceback (most recent call last):
...
glassgpt.errors.ConfigError: step: unknown field; known fields: lr, steps
>>> apply_overrides({"train": {"lr": 1.0}}, ["train.lr=0.5", "seed=3"])
{'train': {'lr': 0.5}, 'seed': 3}
"""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from glassgpt.errors import ConfigError, InputFileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")


def check(condition: bool, field: str, message: str) -> None:
    """Raise ``ConfigError(field, message)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, message)


def check_finite(table: Any, names: tuple[str, ...], *, positive: bool) -> None:
    """Each field of ``table`` in ``names`` finite and > 0 (``positive``) or ≥ 0; the error
    names the field."""
    for name in names:
        value = getattr(table, name)
        ok = (value > 0 if positive else value >= 0) and math.isfinite(value)
        check(ok, name, f"must be {'>' if positive else '≥'} 0, got {value}")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a missing or malformed file is a one-line :class:`GlassError`."""
    p = Path(path)
    if not p.is_file():
        raise InputFileError(f"config file not found: {p}")
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise InputFileError(f"{p}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise InputFileError(f"{p}: not UTF-8 at byte {e.start}") from None


def parse_toml(text: str, where: str | Path) -> dict[str, Any]:
    """TOML text read from ``where`` (a file, or a file inside a checkpoint); malformed TOML
    is a one-line :class:`GlassError` naming it.

    >>> parse_toml("[model]\\nn_layers = 2", "config.toml")
    {'model': {'n_layers': 2}}
    """
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputFileError(f"{where}: invalid TOML: {e}") from None


def parse_value(text: str) -> Any:
    """Parse the right-hand side of ``--set key=value`` as a TOML value, else keep the string.

    >>> [parse_value(s) for s in ["3", "1e-3", "true", "gelu", "[1, 2]", '"7"']]
    [3, 0.001, True, 'gelu', [1, 2], '7']
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with each ``dotted.key=value`` set (nested dicts created)."""
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(item, "an override must look like key=value")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(key, f"{part!r} is a value, not a section")
            node = child
        node[parts[-1]] = parse_value(raw.strip())
    return out


def merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``update`` into a copy of ``base``."""
    out = _deep_copy(dict(base))
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = _deep_copy(v)
    return out


def _deep_copy(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _deep_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_deep_copy(x) for x in v]
    return v


def from_dict(cls: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
    """Build dataclass ``cls`` from ``data``: nested sections, type coercion, named errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix.rstrip(".") or cls.__name__, "expected a table of fields")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(prefix + unknown[0], f"unknown field; known fields: {known}")
    kwargs = {name: coerce(value, hints[name], prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:  # a section's own check names its field: give it the full path
        if not prefix or e.field.startswith(prefix):
            raise
        message = str(e)[len(e.field) + 2 :]
        raise ConfigError(prefix + e.field, message) from None


def to_dict(obj: Any) -> Any:
    """A dataclass as plain dicts/lists (TOML/JSON-ready); tuples become lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


class Table:
    """A frozen config dataclass's table methods: ``from_dict`` (unknown keys raise naming the
    key), ``to_dict`` and ``replace`` (a copy, re-validated)."""

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any], *, prefix: str = "") -> T:
        return from_dict(cls, data, prefix=prefix)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def replace(self: T, **changes: Any) -> T:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def coerce(value: Any, hint: Any, field: str) -> Any:
    """Convert ``value`` to the annotated type ``hint`` or raise ``ConfigError(field, ...)``."""
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if dataclasses.is_dataclass(value):
            return value
        return from_dict(hint, value, prefix=field + ".")
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            options = ", ".join(repr(c) for c in choices)
            raise ConfigError(field, f"must be one of {options}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(hint)
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, field)
            except ConfigError as e:
                errors.append(e)
        raise errors[0] if errors else ConfigError(field, f"invalid value {value!r}")
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(field, f"expected a list, got {value!r}")
        args = get_args(hint)
        item = args[0] if args else Any
        return origin(coerce(v, item, f"{field}[{i}]") for i, v in enumerate(value))
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(field, f"expected true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(field, f"expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(field, f"expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(field, f"expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(field, f"expected a string, got {value!r}")
    return value
