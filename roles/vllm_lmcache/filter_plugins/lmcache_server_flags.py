"""Filters of the vllm_lmcache role for LMCache's multiprocess server (`lmcache server`, the
offload_mp variant): its command line checked against the flags the pinned LMCache version
prints in `lmcache server --help`, and its L2 adapters against the types that version registers.

argparse exits on an unknown flag, so a typo would not be silent; but it exits only when the unit
starts, after the role has already replaced a working configuration, and a unit in a restart loop
is found late. The role refuses the command line before it changes anything instead. The flag
list is ``files/lmcache_server_flags.json``; the engine tier
(tests/engine/test_lmcache_mp_engine.py) keeps it equal to the engine venv's
``lmcache server --help``.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any


def _version(text: Any) -> tuple[int, ...]:
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not match:
        raise ValueError(f"not an LMCache version: {text!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def lmcache_server_known_flags(flag_doc: dict[str, Any], version: str) -> dict[str, dict[str, Any]]:
    """{flag: {"value": bool, "many": bool}} of `lmcache server` in LMCache ``version``: the
    recorded flags from the version they were checked against on, none before it."""
    if _version(version) < _version(flag_doc["since"]):
        return {}
    return {flag: dict(spec) for flag, spec in flag_doc["flags"].items()}


def lmcache_server_flag_problems(
    argv: list[Any], flag_doc: dict[str, Any], version: str, extra_known: list[str]
) -> list[str]:
    """Messages for every flag of ``argv`` (the arguments after `lmcache server`) that LMCache
    ``version`` does not take, with the nearest known spelling, and for a flag that takes a value
    given none. ``extra_known``: flags a newer LMCache takes, vouched for by the user (each takes
    one value unless written ``--flag=``-less in argv)."""
    known = lmcache_server_known_flags(flag_doc, version)
    extra = {str(flag): {"value": True} for flag in extra_known}
    specs = {**extra, **known}
    words = [str(word) for word in argv]
    problems: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-"):
            problems.append(f'"{word}" is not a flag and no flag before it takes a value')
            continue
        flag, has_inline, _ = word.partition("=")
        spec = specs.get(flag)
        if spec is None:
            near = difflib.get_close_matches(flag, sorted(specs), n=1, cutoff=0.6)
            hint = f' (did you mean "{near[0]}"?)' if near else ""
            problems.append(f'"{flag}" is not a flag of lmcache server {version}{hint}')
            if not has_inline and i < len(words) and not words[i].startswith("-"):
                i += 1  # its value
            continue
        if not spec.get("value"):
            if has_inline:
                problems.append(f'"{flag}" takes no value (got "{word}")')
            continue
        if has_inline:
            continue
        if i >= len(words) or words[i].startswith("--"):
            problems.append(f'"{flag}" needs a value')
            continue
        i += 1
        while spec.get("many") and i < len(words) and not words[i].startswith("-"):
            i += 1
    return problems


def lmcache_server_l2_problems(adapters: Any, flag_doc: dict[str, Any]) -> list[str]:
    """Messages for L2 adapter specs LMCache would refuse at start: not a mapping, no "type", or
    a type the version does not register."""
    if not isinstance(adapters, list):
        return [f"the L2 adapters must be a list of mappings (got {type(adapters).__name__})"]
    types = set(flag_doc["l2_adapter_types"])
    problems = []
    for index, adapter in enumerate(adapters):
        if not isinstance(adapter, dict):
            problems.append(f"L2 adapter {index} is not a mapping: {adapter!r}")
            continue
        kind = adapter.get("type")
        if kind not in types:
            near = difflib.get_close_matches(str(kind), sorted(types), n=1, cutoff=0.6)
            hint = f' (did you mean "{near[0]}"?)' if near else ""
            problems.append(f'L2 adapter {index} has type "{kind}", not one of LMCache\'s{hint}')
    return problems


def lmcache_server_l2_args(adapters: list[dict[str, Any]]) -> list[str]:
    """`--l2-adapter JSON` once per adapter, in order (LMCache's prefetch policy `default`
    reads from the first adapter that has a key)."""
    args: list[str] = []
    for adapter in adapters:
        args += ["--l2-adapter", json.dumps(adapter, separators=(",", ":"), sort_keys=True)]
    return args


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "lmcache_server_known_flags": lmcache_server_known_flags,
            "lmcache_server_flag_problems": lmcache_server_flag_problems,
            "lmcache_server_l2_problems": lmcache_server_l2_problems,
            "lmcache_server_l2_args": lmcache_server_l2_args,
        }
