"""Text a host handed us, made safe to show: no terminal control, no markup, valid XML.

Why: a GPU host writes every string in its evidence document (vLLM version, the probe's stderr,
log excerpts, its own name) and a compromised one chooses them. Printed as they are, an ESC
sequence moves the operator's cursor and erases other hosts' FAIL rows (ECMA-48 CSI, e.g.
`ESC [2K` erase line, `ESC [1A` cursor up), U+009B is the same CSI in one byte, a `[/]` in a
rich markup string raises MarkupError and takes the whole fleet's report with it, and one
control character makes JUnit XML that every parser rejects (XML 1.0 §2.2 `Char` excludes C0
controls but TAB, LF, CR: https://www.w3.org/TR/xml/#charsets).

So every renderer passes host-derived text through `printable` first (one rule for terminal,
JUnit, Markdown, HTML) and, where the text goes into a rich markup string, through `markup`
(rich's own escape: https://rich.readthedocs.io/en/stable/markup.html#escaping). Ordinary text
comes out unchanged, byte for byte.
"""

from __future__ import annotations

import re

from rich.markup import escape

# Replaced wherever they occur: C0 controls but TAB and LF, DEL and the C1 controls (ECMA-48
# §5: terminals act on them), UTF-16 surrogates (not XML characters, and a lone one cannot be
# written as UTF-8: json.loads accepts "\ud800"), the XML non-characters U+FFFE/U+FFFF, and
# the bidirectional overrides that make a terminal show text in another order than it reads
# (CVE-2021-42574, https://trojansource.codes/).
_CLASS = "\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_CLASS}]")
# Also replaced in one-line text: a newline there lets a host forge a line of our own output.
_UNSAFE_ONE_LINE = re.compile(f"[{_CLASS}\n]")


def _visible(match: re.Match[str]) -> str:
    """The character as Python writes it in a literal (`\\x1b`, `\\r`, `\\u202e`): the reader
    sees what the host sent, and nothing acts on it."""
    return repr(match.group())[1:-1]


def printable(text: object, *, one_line: bool = False) -> str:
    """`text` with every control character (LF and TAB kept unless `one_line`) shown as its
    escape (`ESC` → `\\x1b`). Pure; for any renderer, before its own escaping."""
    return (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_visible, str(text))


def markup(text: object, *, one_line: bool = True) -> str:
    """`printable` text to embed in a rich markup string: its brackets shown, never parsed."""
    return escape(printable(text, one_line=one_line))


def json_safe(document: str) -> str:
    """JSON text (from `json.dumps(..., ensure_ascii=False)`) with every character
    `printable` would escape written as JSON's own `\\uXXXX` escape (RFC 8259 §7): the same
    document for any parser, nothing a terminal acts on when it is printed. Outside strings
    JSON text is ASCII structure and LF/TAB whitespace, so only string contents change."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", document)


# Markdown: raw HTML passes through CommonMark (https://spec.commonmark.org/0.31.2/#raw-html),
# so a host's `<img src=x onerror=...>` would be live in any viewer that renders it; entity
# references show the characters instead (§2.5). Only these three are replaced: ordinary
# host text (versions, models, URLs) has none and keeps its bytes.
_MD_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def markdown_inline(text: object) -> str:
    """One-line host text for Markdown prose or a table cell: `printable`, no raw HTML."""
    return "".join(_MD_HTML.get(ch, ch) for ch in printable(text, one_line=True))


def markdown_code(text: object) -> str:
    """One-line host text as a Markdown code span whose fence no backtick in it can close
    (CommonMark §6.1: a span closes on a backtick string of the same length)."""
    body = printable(text, one_line=True)
    fence = "`" * (_longest_backtick_run(body) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def markdown_fence(text: str) -> str:
    """A fence for a code block of `text` that no line of it can close (§4.5)."""
    return "`" * max(3, _longest_backtick_run(text) + 1)


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)
