"""Small helpers shared by the tool-output parsers."""

from __future__ import annotations

import re

# What a finding or warning shows of one host value: enough to recognise it, never a whole
# hostile document (a report is read by people and stored as JSON/JUnit).
MAX_SHOWN_CHARS = 200


def clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text` cut to `limit` characters, the cut marked with how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[truncated, {len(text)} chars]"


def clip_repr(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """repr() of a host value, cut like `clip`."""
    return clip(repr(value), limit)


_PROMPT = re.compile(r"^\s*(\[[^\]]*\]|\S*[@:]\S*\s*|[\w.\-]+)?[$#]\s+\S")


def looks_like_prompt(line: str) -> bool:
    """True for a copied shell prompt line such as `sh-5.1# gdsio ...` or `$ gdscheck -p`:
    recorded outputs often include the command line, which is not tool output."""
    return bool(_PROMPT.match(line))


def to_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def to_float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.strip())
    except ValueError:
        return None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'2.17.5' → (2, 17, 5); '2:7:47' → (2, 7, 47); leading 'v' and suffixes ignored.
    None when no leading number: comparisons must not guess."""
    if not text:
        return None
    match = re.match(r"\s*v?(\d+(?:[.:]\d+)*)", text)
    if not match:
        return None
    return tuple(int(part) for part in re.split(r"[.:]", match.group(1)))
