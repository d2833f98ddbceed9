"""Typed loading: plain YAML mappings into frozen dataclasses, every problem at once.

Generic, with no knowledge of nmt's keys: `nmt.config` declares the schema (dataclasses whose
fields carry a range and a help text, made with `option`) and passes in what is particular
to it (renamed keys, values with aliases). `build` checks a mapping against a dataclass and
collects one line per problem (unknown keys with a "did you mean", wrong types, out-of-range
numbers, invalid choices), each with its key path, so that a user fixes a config in one go.
Standard library + PyYAML only, so `nmt check-config` stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from nmt.errors import NmtError, cut
from nmt.yaml_loader import Written, load_yaml

# A key path ("model.attention") -> a function that turns a value into the one the schema
# knows (an alias into its name); applied before the type check.
Normalisers = Mapping[str, Callable[[Any], Any]]


class ConfigError(NmtError, ValueError):
    """One or more problems in a configuration; `problems` holds one line each."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))


def option(
    default: Any,
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    help: str = "",
):
    """A field with an allowed range (`above`: a strict lower bound); `help` documents it."""
    return field(default=default, metadata={"min": min, "max": max, "above": above, "help": help})


def plain(value: Any) -> Any:
    """Tuples to lists, recursively, so YAML/JSON stay plain."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- checking


def type_name(tp: Any) -> str:
    """How a type is named in error messages and the configuration reference."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(type_name(a) for a in options) + " or null"
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {type_name(args[0])}"
        return f"a list of {len(args)} " + "/".join(type_name(a) for a in args)
    if origin is list:
        return f"a list of {type_name(get_args(tp)[0])}"
    if origin is dict:
        values = get_args(tp)[1]
        return "a mapping" if values is Any else f"a mapping to {type_name(values)}"
    if tp is Any:
        return "anything"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def show(value: Any, limit: int = 60) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: a value can be huge
    (a YAML file that expands, a pasted corpus) and the message stays one readable line.
    A number read from YAML shows as the file wrote it (`1e4`, not 10000.0: `Written`)."""
    return cut(repr(value), limit)


_MISSING = object()
# What each scalar type accepts from YAML (bool is an int in Python, so it is kept apart).
_SCALARS: dict[Any, tuple[type, ...]] = {
    bool: (bool,),
    int: (int,),
    float: (int, float),
    str: (str, int, float),
}


@dataclass
class _Checker:
    """One pass over a mapping: the schema's particular rules, and the problems found."""

    renamed: Mapping[str, str]
    normalise: Normalisers
    problems: list[str] = field(default_factory=list)

    def coerce(self, value: Any, tp: Any, path: str) -> Any:
        """Check `value` against type `tp`; return the converted value or _MISSING."""
        origin = get_origin(tp)
        if origin in (Union, types.UnionType):
            if value is None:
                return None
            for a in get_args(tp):
                if a is not type(None):
                    out = _Checker(self.renamed, self.normalise).coerce(value, a, path)
                    if out is not _MISSING:
                        return out
            return self._wrong(value, tp, path)
        if origin is Literal:
            choices = get_args(tp)
            if isinstance(value, str) and value.lower() in choices:
                return value.lower()
            self.problems.append(
                f"{path}: {show(value)} is not allowed; expected one of {', '.join(choices)}"
            )
            return _MISSING
        if origin is tuple:
            return self._items(value, tp, path)
        if origin in (list, dict):
            return self._container(value, tp, path)
        if tp is Any:
            return value
        if isinstance(value, Written):
            if tp is not str and (why := value.unlike_yaml_1_2()):
                self.problems.append(f"{path}: {value.text} {why}")
                return _MISSING
            value = value.read_as(tp)  # a plain YAML scalar: the schema says how to read it
        accepts = _SCALARS.get(tp)
        bool_mixup = isinstance(value, bool) and tp is not bool
        if accepts is not None and isinstance(value, accepts) and not bool_mixup:
            if tp is float and not math.isfinite(typing.cast(float, value)):  # .nan, .inf
                self.problems.append(f"{path}: expected a finite number, got {show(value)}")
                return _MISSING
            return tp(value)
        return self._wrong(value, tp, path)

    def _wrong(self, value: Any, tp: Any, path: str) -> Any:
        self.problems.append(f"{path}: expected {type_name(tp)}, got {show(value)}")
        return _MISSING

    def _items(self, value: Any, tp: Any, path: str) -> Any:
        """A tuple: of one type and any length (`tuple[str, ...]`), or of fixed types."""
        args = get_args(tp)
        if isinstance(value, str) and len(args) == 2 and args[1] is Ellipsis:
            value = (value,)  # a single split name is a list of one
        if not isinstance(value, (list, tuple)):
            return self._wrong(value, tp, path)
        item_types = [args[0]] * len(value) if args[1:] == (Ellipsis,) else list(args)
        if len(item_types) != len(value):
            self.problems.append(f"{path}: expected {type_name(tp)}, got {len(value)} items")
            return _MISSING
        items = [
            self.build(typing.cast(type, t), v, f"{path}[{i}]")
            if dataclasses.is_dataclass(t)
            else self.coerce(v, t, f"{path}[{i}]")
            for i, (v, t) in enumerate(zip(value, item_types, strict=True))
        ]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)

    def _container(self, value: Any, tp: Any, path: str) -> Any:
        """A list (`list[T]`) or a mapping (`dict[K, V]`), each item checked."""
        args = get_args(tp)
        if not isinstance(value, get_origin(tp)):
            return self._wrong(value, tp, path)
        if isinstance(value, list):
            items = [self.coerce(v, args[0], f"{path}[{i}]") for i, v in enumerate(value)]
            return _MISSING if any(i is _MISSING for i in items) else items
        pairs = [
            (self.coerce(k, args[0], path), self.coerce(v, args[1], f"{path}.{k}"))
            for k, v in value.items()
        ]
        return _MISSING if any(k is _MISSING or v is _MISSING for k, v in pairs) else dict(pairs)

    def build(self, cls: type, raw: Any, path: str) -> Any:
        """Dataclass `cls` from a mapping; a key with a problem keeps its default."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.problems.append(f"{path or 'config'}: expected a mapping of keys, got {show(raw)}")
            return cls()
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            key_path = f"{path}.{key}" if path else str(key)
            key = self.renamed.get(key_path, key)
            if key not in fields:
                near = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                self.problems.append(
                    f"{cut(key_path, 80)}: unknown key{hint}; known keys: {', '.join(fields)}"
                )
                continue
            tp = hints[key]
            if dataclasses.is_dataclass(tp):
                kwargs[key] = self.build(typing.cast(type, tp), value, key_path)
                continue
            if key_path in self.normalise:
                value = self.normalise[key_path](value)
            out = self.coerce(value, tp, key_path)
            if out is not _MISSING and not self._out_of_range(out, value, fields[key], key_path):
                kwargs[key] = out
        return cls(**kwargs)

    def _out_of_range(self, value: Any, written: Any, f: dataclasses.Field, path: str) -> bool:
        """Check a number against the field's `option` range; True (and said) when outside.
        The message shows the number as the user wrote it (`-1`, `1e-4`), not as the field
        converted it (`-1.0`, `0.0001`), and a whole bound as a whole number."""
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        lo, hi, above = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("above")
        said = show(written)
        if lo is not None and value < lo:
            self.problems.append(f"{path}: {said} is below the minimum {bound(lo)}")
        elif above is not None and value <= above:
            off = " (null turns it off)" if value == above and f.default else ""
            self.problems.append(f"{path}: {said} must be above {bound(above)}{off}")
        elif hi is not None and value > hi:
            self.problems.append(f"{path}: {said} is above the maximum {bound(hi)}")
        else:
            return False
        return True


def bound(x: float) -> str:
    """A range's end as messages and the configuration reference write it: `0`, not `0.0`;
    `0.95` as it is."""
    return str(int(x)) if isinstance(x, float) and x.is_integer() else repr(x)


def build(
    cls: type,
    raw: Any,
    *,
    renamed: Mapping[str, str] | None = None,
    normalise: Normalisers | None = None,
) -> tuple[Any, list[str]]:
    """Dataclass `cls` from a plain mapping, and every problem found (one line each, with
    its key path). `renamed` maps old key paths to today's key names; `normalise` maps key
    paths to a function applied to their value before the type check (aliases)."""
    checker = _Checker(renamed or {}, normalise or {})
    return checker.build(cls, raw, ""), checker.problems


# --------------------------------------------------------------------------- --set


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value parsed as YAML)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            [f"--set {show(text)}: expected KEY=VALUE, e.g. train.lr=0.0005"], "--set"
        )
    parts = key.strip().split(".")
    if any(not p for p in parts):
        raise ConfigError([f"--set {show(text)}: malformed key {show(key)}"], "--set")
    try:
        parsed = load_yaml(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def apply_override(raw: dict[str, Any], parts: list[str], value: Any) -> None:
    node = raw
    for p in parts[:-1]:
        child = node.get(p)
        # a copy of each level on the way: the caller's nested mappings stay as they were
        child = dict(child) if isinstance(child, dict) else {}
        node[p] = child
        node = child
    node[parts[-1]] = value
