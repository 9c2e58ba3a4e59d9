"""Typed configs: dataclasses whose field types are the schema.

A config section is a ``@dataclass``; :func:`from_dict` checks a plain dict (a TOML table,
a JSON object, keyword options) against the field types and returns an instance, raising
:class:`~spikerec.errors.ConfigError` that names the key, what was expected and what was
given. The types say everything:

* ``bool``, ``int`` (not a bool), ``float`` (an int is accepted and converted), ``str``,
  ``dict`` (a table), ``list[T]`` / ``tuple[T, ...]`` / ``tuple[A, B]`` (a list);
* ``Literal["a", "b"]``: one of the choices;
* ``X | None``: also ``None`` (a JSON ``null``; TOML has none: leave the key out);
* ``Annotated[float, Range(gt=0)]``: a bound; every ``float`` must be finite (``nan`` and
  ``inf`` are refused) unless its ``Range`` says ``finite=False``.

Cross-field rules (e.g. ``clip = (lo, hi)`` with ``lo <= 1 <= hi``) stay as short explicit
checks in the config class (a ``check()`` method, called after the field checks).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from .errors import ConfigError

__all__ = ["Range", "from_dict", "validate", "check_value", "defaults", "field_names", "to_dict", "unknown_key",
           "type_name"]


@dataclass(frozen=True)
class Range:
    """Bounds of a number (``gt``/``ge``/``lt``/``le``); ``finite=False`` admits ``inf``."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    finite: bool = True
    nonempty: bool = False  # for lists/tuples: at least one item

    def violation(self, v) -> str | None:
        if isinstance(v, (list, tuple)):
            return "a non-empty list" if self.nonempty and not v else None
        for op, bound, ok in (("> ", self.gt, lambda a, b: a > b), (">= ", self.ge, lambda a, b: a >= b),
                              ("< ", self.lt, lambda a, b: a < b), ("<= ", self.le, lambda a, b: a <= b)):
            if bound is not None and not ok(v, bound):
                return self.describe()
        return None

    def describe(self) -> str:
        lo = f"> {self.gt:g}" if self.gt is not None else f">= {self.ge:g}" if self.ge is not None else ""
        hi = f"< {self.lt:g}" if self.lt is not None else f"<= {self.le:g}" if self.le is not None else ""
        return " and ".join(s for s in (lo, hi) if s)


def type_name(hint) -> str:
    """How a type reads in a message: ``an integer``, ``a number``, ``one of a, b``, ..."""
    hint, _ = _unwrap(hint)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return _choices(typing.get_args(hint))
    if origin in (Union, types.UnionType):
        names = [type_name(a) for a in typing.get_args(hint) if a is not type(None)]
        return " or ".join(names)
    if origin in (list, tuple) or hint in (list, tuple):
        return "a list"
    if origin is dict or hint is dict:
        return "a table"
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint)))


def _choices(choices) -> str:
    return "one of " + ", ".join(f"'{c}'" if "," in str(c) else str(c) for c in choices)


def _unwrap(hint):
    """``(base type, Range or None)`` of ``Annotated[base, Range(...)]``."""
    if typing.get_origin(hint) is Annotated:
        base, *meta = typing.get_args(hint)
        rng = next((m for m in meta if isinstance(m, Range)), None)
        return base, rng
    return hint, None


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def check_value(key: str, hint, value, shown=None):
    """``value`` checked against ``hint`` (and converted: int -> float, list -> tuple); a
    :class:`ConfigError` names ``key``. ``shown`` is how the value is quoted (default its repr)."""
    shown = repr(value) if shown is None else shown
    base, rng = _unwrap(hint)
    origin = typing.get_origin(base)

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"'{key}' must be {expected}, got {shown}")

    if origin in (Union, types.UnionType):
        args = typing.get_args(base)
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return check_value(key, Annotated[rest[0], rng] if rng else rest[0], value, shown)
        for a in rest:
            try:
                return check_value(key, a, value, shown)
            except ConfigError:
                continue
        raise bad(type_name(base))
    if origin is Literal:
        choices = typing.get_args(base)
        if value not in choices or isinstance(value, bool) != any(isinstance(c, bool) for c in choices):
            raise bad(_choices(choices))
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise bad("a boolean (true/false)")
    elif base is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad("an integer")
    elif base is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise bad("a number")
        value = float(value)
        if not math.isfinite(value) and (rng is None or rng.finite or math.isnan(value)):
            raise bad("a finite number")
    elif base is str:
        if not isinstance(value, str):
            raise bad("a string")
    elif base is dict or origin is dict:
        if not isinstance(value, dict):
            raise bad("a table")
    elif base in (list, tuple) or origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        args = typing.get_args(base)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise bad(f"a list of {len(args)} items")
            value = tuple(check_value(f"{key}[{i}]", a, v) for i, (a, v) in enumerate(zip(args, value)))
        elif args:
            value = [check_value(f"{key}[{i}]", args[0], v) for i, v in enumerate(value)]
        value = tuple(value) if (origin or base) is tuple else list(value)
    if rng is not None:
        why = rng.violation(value)
        if why:
            raise bad(why)
    return value


def unknown_key(key: str, valid, where: str) -> ConfigError:
    """The error for a key that is not in ``valid``, with the closest names as a hint."""
    valid = sorted(valid)
    close = difflib.get_close_matches(key.split(".")[-1], valid, n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return ConfigError(f"unknown key '{key}'{hint}; valid keys in {where}: {', '.join(valid)}")


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def defaults(cls) -> dict[str, Any]:
    """``{field: default}`` (JSON-like: tuples as lists)."""
    return to_dict(cls())


def to_dict(obj) -> dict[str, Any]:
    """The fields of a config instance as a JSON-like dict (tuples as lists)."""
    def plain(v):
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v
    return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def from_dict(cls, d: dict | None, section: str):
    """An instance of ``cls`` from ``d`` (missing keys take their defaults). Keys are named
    ``section.key`` in errors; unknown keys are refused with the closest valid names."""
    d = dict(d or {})
    hints = _hints(cls)
    names = field_names(cls)
    out = {}
    for k, v in d.items():
        if k not in hints or k not in names:
            raise unknown_key(f"{section}.{k}", names, f"[{section}]")
        out[k] = check_value(f"{section}.{k}", hints[k], v)
    obj = cls(**out)
    check = getattr(obj, "check", None)
    if check is not None:
        check(section)
    return obj


def validate(obj, section: str):
    """Check every field of an existing instance (e.g. one built in Python) against its type."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, check_value(f"{section}.{f.name}", hints[f.name], getattr(obj, f.name)))
    check = getattr(obj, "check", None)
    if check is not None:
        check(section)
    return obj
