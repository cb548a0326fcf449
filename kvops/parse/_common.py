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


# Longest line a parser looks at. Tool output lines are far shorter (a 16-GPU `nvidia-smi topo`
# row, an `ibdev2netdev -v` line, a mount line with every option: well under 1 KiB); anything
# longer is hostile or garbage, and cutting it bounds the work every pattern does on one line.
MAX_LINE_CHARS = 16 * 1024


def capped_lines(text: str) -> list[str]:
    """`text.splitlines()` with every line cut to MAX_LINE_CHARS."""
    return [line[:MAX_LINE_CHARS] for line in text.splitlines()]


def capped_text(text: str) -> str:
    """`text` with every line cut to MAX_LINE_CHARS (the text itself when none is longer)."""
    if len(text) <= MAX_LINE_CHARS or all(len(ln) <= MAX_LINE_CHARS for ln in text.split("\n")):
        return text
    return "\n".join(capped_lines(text)) + "\n"


# A prompt is an optional prefix, then `$` or `#`, whitespace and a command. The prefix is
# `[user@host dir]`, one word holding `@` or `:` (`root@gpu1:~`), or a plain word (`sh-5.1`).
# Matched piecewise so that no two quantifiers compete for the same characters: one regex
# with `\S*[@:]\S*` took quadratic time on a long run of `@` or `:`.
_AFTER_PROMPT = re.compile(r"[$#]\s+\S")
_WORD = re.compile(r"\S*")
_SPACES = re.compile(r"\s*")
_PLAIN_WORD = re.compile(r"[\w.\-]+")


def _end(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where `pattern` (one that matches the empty string too) stops when started at `pos`."""
    match = pattern.match(text, pos)
    return match.end() if match else pos


def looks_like_prompt(line: str) -> bool:
    """True for a copied shell prompt line such as `sh-5.1# gdsio ...` or `$ gdscheck -p`:
    recorded outputs often include the command line, which is not tool output."""
    text = line[:MAX_LINE_CHARS]
    start = _end(_SPACES, text, 0)
    if _AFTER_PROMPT.match(text, start):
        return True
    if text.startswith("[", start):
        close = text.find("]", start)
        if close >= 0 and _AFTER_PROMPT.match(text, close + 1):
            return True
    end = _end(_WORD, text, start)
    word = text[start:end]
    if len(word) >= 2 and word[-1] in "$#" and _AFTER_PROMPT.match(text, end - 1):
        body = word[:-1]
        if "@" in body or ":" in body or _PLAIN_WORD.fullmatch(body):
            return True
    if "@" in word or ":" in word:  # `user@host $ cmd`: the sign is a word of its own
        return bool(_AFTER_PROMPT.match(text, _end(_SPACES, text, end)))
    return False


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
    match = re.match(r"\s*v?(\d+(?:[.:]\d+)*)", text[:MAX_LINE_CHARS])
    if not match:
        return None
    try:
        return tuple(int(part) for part in re.split(r"[.:]", match.group(1)))
    except ValueError:  # a part of more digits than int() converts: no version
        return None
