"""One small strict loader for kvops' YAML specs, driven by dataclass field metadata.

Why: a misspelt key (`prefix_token: 28000`) silently falling back to a default runs a
different experiment than the operator believes, and each spec used to hand-write its own
unknown-key, type and range checks. Here a spec is a dataclass whose fields carry a `Rule`
(help, range, choices); `load_strict` checks a mapping against it and `reference` prints the
same rules as the spec reference shown by `--help`. Types come from the annotations: `int`
(never a bool), `float` (an int is accepted), `str`; `X | None` also accepts null.
"""

from __future__ import annotations

import dataclasses
import math
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


def spec_field(default: Any = _MISSING, *, default_factory: Any = _MISSING, **rule: Any) -> Any:
    """A dataclass field with its `Rule` (keyword arguments of `Rule`) in the metadata."""
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"rule": Rule(**rule)}
    )


def _kind(annotation: Any) -> tuple[type, bool]:
    """(base type, nullable) of `int`, `float`, `str` or one of them `| None`."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        base = [a for a in args if a is not type(None)]
        return base[0], len(base) < len(args)
    return annotation, False


def _describe(kind: type, nullable: bool, rule: Rule) -> str:
    if rule.choices:
        text = "one of " + ", ".join(rule.choices)
    elif kind is int:
        text = "an integer" + (f" >= {rule.minimum:g}" if rule.minimum is not None else "")
    elif kind is float:
        text = "a number" + (f" > {rule.above:g}" if rule.above is not None else "")
        text += f" >= {rule.minimum:g}" if rule.minimum is not None else ""
        text += f" <= {rule.maximum:g}" if rule.maximum is not None else ""
        text += ", inf" if rule.inf_ok else ""
    else:
        text = "a string"
    return text + (" or null" if nullable else "")


def _value(name: str, value: Any, kind: type, nullable: bool, rule: Rule) -> Any:
    """The checked value, or ValueError with the sentence that says what is allowed."""
    wrong = ValueError(f"{name} must be {_describe(kind, nullable, rule)}")
    if value is None:
        if nullable:
            return None
        raise wrong
    if rule.inf_ok and value == "inf":
        return math.inf
    if kind is str:
        if not isinstance(value, str) or (rule.choices and value not in rule.choices):
            raise wrong
        return value
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


def load_strict(cls: type[T], data: Any, source: str) -> dict[str, Any]:
    """The checked keyword arguments of `cls` from a YAML mapping. Raises ValueError naming
    `source` and the key: not a mapping, unknown keys (with the allowed ones), missing keys
    (fields without a default), a wrong value."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: expected a mapping of keys, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in data and f.default is _MISSING and f.default_factory is _MISSING
    ]
    if missing:
        more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise ValueError(f"{source}: missing field '{missing[0]}'{more}")
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        kind, nullable = _kind(hints[key])
        try:
            values[key] = _value(key, value, kind, nullable, fields[key].metadata["rule"])
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    return values


def reference(cls: type) -> str:
    """The spec reference: one line per key with its type, default and help."""
    hints = typing.get_type_hints(cls)
    lines = []
    for f in dataclasses.fields(cls):
        rule: Rule = f.metadata["rule"]
        kind, nullable = _kind(hints[f.name])
        shown = "null" if f.default is None else f.default
        default = "" if f.default is _MISSING else f"  [default: {shown}]"
        lines.append(f"{f.name}: {_describe(kind, nullable, rule)}{default}\n    {rule.help}")
    return "\n".join(lines)
