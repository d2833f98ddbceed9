"""The YAML loader of configs: PyYAML's safe loader, without aliases, that keeps the text of
each plain scalar YAML 1.1 reads as a number or a yes/no word (`Written`), so that the schema
decides how it reads (`nmt.typed`): `src_lang: no` stays Norwegian, `lr: 1e-4` is a number.
Generic, with no knowledge of nmt's keys; standard library + PyYAML only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from nmt.errors import cut


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (`*name`): a config has no need to repeat a
    node, and aliases of aliases expand exponentially (400 bytes to 52 MB and 350 MB of
    memory: the "billion laughs"), which a loader must refuse before building them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{cut(event.anchor, 30)}) are not allowed",
                event.start_mark,
            )
        return super().compose_node(parent, index)


class Written:
    """A plain YAML scalar that YAML 1.1 (PyYAML's) reads as something other than text, with
    the text as the file wrote it. The schema says how it is read: a string field keeps the
    text, where YAML 1.1 had made a Norwegian `src_lang: no` False and `name: 1.50` 1.5; a
    number or a yes/no field takes the value. Shown as written in messages (`1e4`)."""

    text: str
    base: type  # the value's own type

    def __new__(cls, value: Any, text: str) -> Any:
        out = super().__new__(cls, value)  # type: ignore[call-arg]
        out.text = text
        return out

    def __repr__(self) -> str:
        return self.text

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles keep the text
        return type(self), (self.base(self), self.text)

    def read_as(self, tp: Any) -> Any:
        return self.text if tp is str else self

    def unlike_yaml_1_2(self) -> str:
        """Why the value YAML 1.1 gave is not what YAML 1.2 (and a reader) would ("" where
        they agree): a number read in base 60 or a leading zero read as octal."""
        if ":" in self.text:  # 1:30 is 90 in YAML 1.1, text in YAML 1.2
            return (
                f"is {self.base(self)!r} in YAML 1.1 (base 60) and text in YAML 1.2; write the "
                "number you mean"
            )
        return ""


class _Int(Written, int):
    base = int

    def unlike_yaml_1_2(self) -> str:
        if _LEADING_ZERO.match(self.text):  # 010: octal 8 in YAML 1.1, 10 in YAML 1.2
            decimal = int(self.text.replace("_", ""), 10)
            if decimal != int(self):  # (007 is 7 either way)
                sign = "-" if self.text.startswith("-") else ""
                digits = self.text.lstrip("+-").lstrip("0_")
                return (
                    f"is octal {int(self)} in YAML 1.1 and {decimal} in YAML 1.2; write "
                    f"{decimal}, or {sign}0o{digits} for octal"
                )
        return super().unlike_yaml_1_2()


# An integer with a leading zero (not 0 itself): octal in YAML 1.1, decimal in YAML 1.2.
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]*[0-9][0-9_]*$")


class _Float(Written, float):
    base = float


class _Word(Written, str):
    """yes/no/on/off: a bool only where the schema expects one; text everywhere else."""

    base = str

    def __repr__(self) -> str:
        return repr(self.text)

    def read_as(self, tp: Any) -> Any:  # YAML 1.1's own table of words
        return (
            yaml.constructor.SafeConstructor.bool_values[self.lower()] if tp is bool else self.text
        )


def _written(kind: type, construct: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def read(loader: Any, node: Any) -> Any:
        try:
            return kind(construct(loader, node), node.value)
        except ValueError:  # Python reads an int of at most 4,300 digits
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a number of {len(node.value):,} characters is too long to read",
                node.start_mark,
            ) from None

    return read


def _bool(loader: Any, node: Any) -> Any:
    if node.value.lower() in ("true", "false"):
        return loader.construct_yaml_bool(node)
    return _Word(node.value, node.value)


_Loader.add_constructor("tag:yaml.org,2002:int", _written(_Int, _Loader.construct_yaml_int))
_Loader.add_constructor("tag:yaml.org,2002:float", _written(_Float, _Loader.construct_yaml_float))
_Loader.add_constructor("tag:yaml.org,2002:bool", _bool)
# No field holds a date: `name: 2026-11-29` is the text, not a datetime.date.
_Loader.add_constructor("tag:yaml.org,2002:timestamp", lambda loader, node: str(node.value))
# YAML 1.2's octal form (`0o17`), text in YAML 1.1; Python's int(text, 8) reads it.
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?0o[0-7_]+$"), list("-+0"))
# YAML 1.2's (and JSON's) exponent forms that YAML 1.1 reads as strings: `1e-4`, `2E6`,
# `1.5e4` (1.1 wants a dot and a signed exponent). Every config means the number.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
