"""cufile.json (JSON with `//` comments) → config, dotted keys, and keys libcufile ignores.

libcufile ignores keys it does not know, so a typo (`allow_compat_mod`) silently keeps the
default. Every key is compared with the list recognised by libcufile 1.14.1.1 plus the CUDA
13.x additions (cufile_keys.json, shared with the cufile role); unknown ones come with the
closest known key as a suggestion.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from kvops.parse._common import clip_repr


def _load_key_types() -> dict[str, str]:
    """The one key list (with value types) shared with the cufile role, which links to it."""
    text = resources.files(__package__).joinpath("cufile_keys.json").read_text(encoding="utf-8")
    keys: dict[str, str] = json.loads(text)["keys"]
    return keys


# Dotted key -> JSON type of its value: bool, int, str, list[int], list[str], dict.
KEY_TYPES: dict[str, str] = _load_key_types()
KNOWN_KEYS: frozenset[str] = frozenset(KEY_TYPES)
# Children of a mount_table are mount paths (free names), each holding these keys.
MOUNT_TABLE_ENTRY_KEYS = frozenset({"rdma_dev_addr_list"})


@dataclass
class UnknownKey:
    key: str
    suggestion: str | None


@dataclass
class CufileConfig:
    config: dict[str, Any] | None = None
    values: dict[str, Any] = field(default_factory=dict)
    unknown_keys: list[UnknownKey] = field(default_factory=list)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    def get(self, dotted: str) -> Any:
        return self.values.get(dotted)

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "values": self.values,
            "unknown_keys": [{"key": u.key, "suggestion": u.suggestion} for u in self.unknown_keys],
            "warnings": list(self.warnings),
        }


def strip_comments(text: str) -> str:
    """Blank out `//` comments outside strings, keeping every other character in place so a
    JSON error's line and column still point into the original file."""
    out: list[str] = []
    i, in_string, n = 0, False, len(text)
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch == "/" and i + 1 < n and text[i + 1] == "/":
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def suggest(key: str) -> str | None:
    """Closest known key: first among keys of the same section, then by leaf name anywhere."""
    matches = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.75)
    if matches:
        return matches[0]
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in sorted(KNOWN_KEYS)}
    leaf_match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
    return by_leaf[leaf_match[0]] if leaf_match else None


def _walk(node: dict[str, Any], prefix: str, result: CufileConfig) -> None:
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if dotted.endswith(".mount_table") and dotted in KNOWN_KEYS and isinstance(value, dict):
            result.values[dotted] = value
            for mount, entry in value.items():
                for sub in entry if isinstance(entry, dict) else {}:
                    if sub not in MOUNT_TABLE_ENTRY_KEYS:
                        result.unknown_keys.append(
                            UnknownKey(f"{dotted}.{mount}.{sub}", "rdma_dev_addr_list")
                        )
            continue
        if isinstance(value, dict) and dotted not in KNOWN_KEYS:
            _walk(value, dotted + ".", result)
            continue
        result.values[dotted] = value
        if dotted not in KNOWN_KEYS:
            result.unknown_keys.append(UnknownKey(dotted, suggest(dotted)))


def _pairs_hook(warnings: list[str]) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                warnings.append(f"duplicate key {clip_repr(key)}: the last value is used")
            seen[key] = value
        return seen

    return hook


def parse_cufile(text: str) -> CufileConfig:
    """Parse cufile.json. A syntax error is returned in `error` with line and column."""
    result = CufileConfig()
    try:
        parsed = json.loads(strip_comments(text), object_pairs_hook=_pairs_hook(result.warnings))
    except json.JSONDecodeError as exc:
        result.error = f"line {exc.lineno} column {exc.colno}: {exc.msg}"
        return result
    except RecursionError:
        result.error = "nesting too deep"
        return result
    except ValueError as exc:  # e.g. a number of more digits than int() converts
        result.error = f"a value does not load: {str(exc)[:120]}"
        return result
    if not isinstance(parsed, dict):
        result.error = f"top level is {type(parsed).__name__}, expected an object"
        return result
    result.config = parsed
    _walk(parsed, "", result)
    return result
