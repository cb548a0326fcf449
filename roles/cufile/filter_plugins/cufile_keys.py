"""Filters of the cufile role: check a cufile.json dict against libcufile's known keys and types.

The key list with value types is ``files/cufile_keys.json``, a link to the one list
``kvops/parse/cufile_keys.json`` that ``kvops validate`` uses too.
"""

from __future__ import annotations

import difflib
from typing import Any

_TRUE = {"true", "yes", "on"}
_FALSE = {"false", "no", "off"}


def _is_container(path: str, known: set[str]) -> bool:
    prefix = path + "."
    return any(k.startswith(prefix) for k in known)


def cufile_unknown_keys(
    config: Any,
    known_keys: list[str],
    free_form: list[str],
    hints: dict[str, str] | None = None,
) -> list[dict[str, str]]:
    """Return [{"key": dotted.path, "closest": known key or ""}] for keys libcufile does not know.

    ``known_keys`` are dotted leaf paths ("properties.allow_compat_mode"). A dict value is walked
    when its path is a prefix of known keys; a known key is a leaf whatever its value type.
    ``free_form`` names known keys whose dict value has user-chosen keys (``fs.nfs.mount_table``:
    mount paths), which are not checked. ``hints`` maps known mistakes to the right key
    (gdscheck prints ``properties.use_compat_mode`` for ``properties.allow_compat_mode``).
    """
    hints = hints or {}
    known = set(known_keys)
    unknown: list[dict[str, str]] = []

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, dict):
            return
        for key in node:
            path = f"{prefix}.{key}" if prefix else str(key)
            if path in known or path in free_form:
                continue
            if _is_container(path, known) and isinstance(node[key], dict):
                walk(node[key], path)
                continue
            if path in hints:
                unknown.append({"key": path, "closest": hints[path]})
                continue
            close = difflib.get_close_matches(path, sorted(known), n=1, cutoff=0.6)
            if not close:
                leaf = path.rsplit(".", 1)[-1]
                by_leaf = {k.rsplit(".", 1)[-1]: k for k in sorted(known)}
                leaf_close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
                close = [by_leaf[leaf_close[0]]] if leaf_close else []
            unknown.append({"key": path, "closest": close[0] if close else ""})

    walk(config, "")
    return unknown


def _coerce_scalar(value: Any, kind: str) -> tuple[Any, bool]:
    """(value as ``kind``, ok). Strings that spell the value unambiguously are converted: an
    inventory or ``-e`` often hands over ``"false"`` or ``"16384"``, and libcufile reads a JSON
    string where it expects a boolean or number as a wrong value, not as the intended one."""
    if kind == "bool":
        if isinstance(value, bool):
            return value, True
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE, True
        return value, False
    if kind == "int":
        if isinstance(value, bool):
            return value, False
        if isinstance(value, int):
            return value, True
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value.strip()), True
        return value, False
    if kind == "str":
        return value, isinstance(value, str)
    return value, True


def _coerce(value: Any, kind: str) -> tuple[Any, bool]:
    if kind.startswith("list[") and kind.endswith("]"):
        if not isinstance(value, list):
            return value, False
        items = [_coerce_scalar(v, kind[5:-1]) for v in value]
        return [v for v, _ in items], all(ok for _, ok in items)
    if kind == "dict":
        return value, isinstance(value, dict)
    return _coerce_scalar(value, kind)


def _typed_walk(node: Any, prefix: str, types: dict[str, str], errors: list[str]) -> Any:
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        kind = types.get(path)
        if kind is None:
            out[key] = _typed_walk(value, path, types, errors)
            continue
        typed, ok = _coerce(value, kind)
        if not ok:
            errors.append(f"{path} must be {kind} (got {value!r})")
        out[key] = typed
    return out


def cufile_typed(config: Any, key_types: dict[str, str]) -> dict[str, Any]:
    """The document with every known key's value in its JSON type, and what could not be.

    Returns ``{"document": <typed dict>, "errors": ["properties.io_batchsize must be int
    (got 'many')", ...]}``. Unknown keys are left as they are (``cufile_unknown_keys`` reports
    them).
    """
    errors: list[str] = []
    document = _typed_walk(config, "", key_types, errors)
    return {"document": document, "errors": errors}


class FilterModule:
    """cufile role filters."""

    def filters(self) -> dict[str, Any]:
        return {"cufile_unknown_keys": cufile_unknown_keys, "cufile_typed": cufile_typed}
