"""One small strict loader for kvops' YAML specs, driven by dataclass field metadata.

Why: a misspelt key (`prefix_token: 28000`) silently falling back to a default runs a
different experiment than the operator believes, and each spec used to hand-write its own
unknown-key, type and range checks. Here a spec is a dataclass whose fields carry a `Rule`
(help, range, choices, pattern); `load_strict` checks a mapping against it and `reference`
prints the same rules as the spec reference shown by `--help`. Types come from the annotations:
`int` (never a bool), `float` (an int is accepted), `str`; `X | None` also accepts null;
`tuple[str, ...]` is a list of non-empty strings, `dict[str, str]` (or `Mapping`) a mapping
of names to strings, and `tuple[Spec, ...]` a list of mappings, each checked against the
dataclass `Spec`.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
_MISSING: Any = dataclasses.MISSING


@dataclass(frozen=True)
class Rule:
    """What a field accepts beyond its type, and the one line of help about it."""

    help: str
    minimum: float | None = None
    above: float | None = None  # strictly greater than this
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    inf_ok: bool = False  # the string "inf" reads as math.inf
    # a string (each string of a list) must match this regular expression as a whole;
    # `pattern_is` says in words what a matching string is ("a valid Debian version")
    pattern: str | None = None
    pattern_is: str = ""
    min_items: int = 0  # a list needs at least this many items, each called `item`
    item: str = "item"


def spec_field(default: Any = _MISSING, *, default_factory: Any = _MISSING, **rule: Any) -> Any:
    """A dataclass field with its `Rule` (keyword arguments of `Rule`) in the metadata."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"rule": Rule(**rule)}
    )


def _kind(annotation: Any) -> tuple[Any, bool]:
    """(base type, nullable) of `int`, `float`, `str`, a list or mapping type, or one of them
    `| None`."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        base = [a for a in args if a is not type(None)]
        return base[0], len(base) < len(args)
    return annotation, False


_MAPPINGS = (dict, collections.abc.Mapping)


def _item_type(kind: Any) -> Any:
    """The item type of `tuple[X, ...]`, else None."""
    if typing.get_origin(kind) is tuple:
        return typing.get_args(kind)[0]
    return None


def _describe(kind: Any, nullable: bool, rule: Rule) -> str:
    item = _item_type(kind)
    if item is not None and dataclasses.is_dataclass(item):
        text = f"a list of mappings ({item.__name__})"
    elif item is not None:
        text = "a list of strings" + (f", each {rule.pattern_is}" if rule.pattern_is else "")
        text += f" (at least {rule.min_items})" if rule.min_items else ""
    elif typing.get_origin(kind) in _MAPPINGS:
        text = "a mapping of names to strings"
    elif rule.choices:
        text = "one of " + ", ".join(rule.choices)
    elif kind is int:
        text = "an integer" + (f" >= {rule.minimum:g}" if rule.minimum is not None else "")
    elif kind is float:
        text = "a number" + (f" > {rule.above:g}" if rule.above is not None else "")
        text += f" >= {rule.minimum:g}" if rule.minimum is not None else ""
        text += f" <= {rule.maximum:g}" if rule.maximum is not None else ""
        text += ", inf" if rule.inf_ok else ""
    else:
        text = rule.pattern_is or "a string"
    return text + (" or null" if nullable else "")


def _matches(name: str, value: str, rule: Rule) -> str:
    if rule.pattern is not None and not re.fullmatch(rule.pattern, value):
        raise ValueError(f"{name}: {value!r} is not {rule.pattern_is or rule.pattern}")
    return value


def _container(name: str, value: Any, kind: Any, rule: Rule, where: str) -> Any:
    """A list (`tuple[...]`) or mapping (`dict[str, str]`) value, checked item by item."""
    wrong = ValueError(f"{name} must be {_describe(kind, False, rule)}")
    if typing.get_origin(kind) in _MAPPINGS:
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise wrong
        return dict(value)
    item = _item_type(kind)
    if not isinstance(value, list):
        raise wrong
    if len(value) < rule.min_items:
        count = "one" if rule.min_items == 1 else str(rule.min_items)
        raise ValueError(f"{name}: needs at least {count} {rule.item}")
    if isinstance(item, type) and dataclasses.is_dataclass(item):
        return tuple(
            item(**load_strict(item, v, f"{where}: {name}[{i}]")) for i, v in enumerate(value)
        )
    if not all(isinstance(v, str) and v for v in value):
        raise wrong
    return tuple(_matches(name, v, rule) for v in value)


def _value(name: str, value: Any, kind: Any, nullable: bool, rule: Rule, where: str = "") -> Any:
    """The checked value, or ValueError with the sentence that says what is allowed."""
    wrong = ValueError(f"{name} must be {_describe(kind, nullable, rule)}")
    if value is None:
        if nullable:
            return None
        raise wrong
    if typing.get_origin(kind) in (tuple, *_MAPPINGS):
        return _container(name, value, kind, rule, where)
    if rule.inf_ok and value == "inf":
        return math.inf
    if kind is str:
        if not isinstance(value, str) or (rule.choices and value not in rule.choices):
            raise wrong
        return _matches(name, value, rule)
    number_types: tuple[type, ...] = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_types):
        raise wrong
    if rule.minimum is not None and value < rule.minimum:
        raise wrong
    if rule.above is not None and value <= rule.above:
        raise wrong
    if rule.maximum is not None and value > rule.maximum:
        raise wrong
    return kind(value)


class _Placed(ValueError):
    """A ValueError whose message already names its source and key."""


def load_strict(cls: type[T], data: Any, source: str) -> dict[str, Any]:
    """The checked keyword arguments of `cls` from a YAML mapping. Raises ValueError naming
    `source` and the key: not a mapping, unknown keys (with the allowed ones), missing keys
    (fields without a default), a wrong value."""
    if not isinstance(data, dict):
        raise _Placed(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in set(data) - set(fields))
    if unknown:
        raise _Placed(
            f"{source}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in data and f.default is _MISSING and f.default_factory is _MISSING
    ]
    if missing:
        more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise _Placed(f"{source}: missing field '{missing[0]}'{more}")
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        kind, nullable = _kind(hints[key])
        try:
            values[key] = _value(key, value, kind, nullable, fields[key].metadata["rule"], source)
        except _Placed:  # from a nested mapping, whose message already says where
            raise
        except ValueError as exc:
            raise _Placed(f"{source}: {exc}") from None
    return values


def reference(cls: type) -> str:
    """The spec reference: one line per key with its type, default and help."""
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        rule: Rule = f.metadata["rule"]
        kind, nullable = _kind(hints[f.name])
        shown = "null" if f.default is None else "[]" if f.default == () else f.default
        default = "" if f.default is _MISSING else f"  [default: {shown}]"
        lines.append(f"{f.name}: {_describe(kind, nullable, rule)}{default}\n    {rule.help}")
    return "\n".join(lines)
