"""Filters of the cufile role: check a cufile.json dict against libcufile's known keys."""

from __future__ import annotations

import difflib
from typing import Any


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


class FilterModule:
    """cufile role filters."""

    def filters(self) -> dict[str, Any]:
        return {"cufile_unknown_keys": cufile_unknown_keys}
