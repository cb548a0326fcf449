"""Sizes and durations as operators write them (`500G`, `1.5TiB`, `7d`, `30m`). Pure.

Size suffixes are binary (K = 1024), as `df -h`, `du -h` and LMCache's own `*_size` settings in
GB count them; a plain number is bytes. Duration suffixes: s, m, h, d, w; a plain number is
seconds."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.I)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.I)
_DURATION_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size_bytes(text: str) -> int:
    """`500G` → 536870912000. Raises ValueError naming the accepted forms."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (e.g. 500G, 1.5T, 800GiB, 1048576)")
    return int(float(match.group(1)) * 1024 ** _SIZE_POWERS[match.group(2).lower()])


def parse_duration_s(text: str) -> float:
    """`7d` → 604800.0. Raises ValueError naming the accepted forms."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (e.g. 30m, 12h, 7d, 2w, 3600)")
    return float(match.group(1)) * _DURATION_S[match.group(2).lower()]
