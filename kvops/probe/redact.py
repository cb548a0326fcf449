"""The one redactor: secrets are replaced on the host, before anything is printed.

Evidence bundles get saved, attached to tickets and pasted into chats, so every text the probe
records from the service (unit files, `systemctl show`, argv, environment, LMCache YAML, the
`--kv-transfer-config` JSON) passes through here. It covers the forms secrets take in practice:

- URL credentials anywhere: `redis://user:pw@host`, `HTTPS_PROXY=http://u:p@proxy` (RFC 3986
  §3.2.1 userinfo) → `redis://<redacted>@host`;
- a secret-named key with `=`, `:` or a JSON `"key": value` (`HF_TOKEN=...`, `api_key: ...`,
  `"api_key": "..."`, `REDIS_PASS=...`, `DATABASE_URL=...`);
- a secret-named command-line flag with its value as the next word (`--api-key VALUE`) or
  after `=`;
- a list value (`'api_key': ['sk-1']`, as vLLM logs its non-default args at start-up, whose
  `--api-key` takes several keys) and an HTTP credential (`Authorization: Bearer ...`, any
  case, RFC 6750 §2.1; a lone `Bearer <token>` too);
- a secret-named YAML key whose value is a block or a list on the lines below (`api_key:` then
  `  - sk-...`, `hf_token: |` then `  abc`).

Host text is hostile (anyone who can send a request to vLLM writes into its log), so every
pattern runs in linear time and lines are cut to MAX_LINE_CHARS first.

Runs on the target under Python >= 3.8 with the stdlib only (see `kvops.probe.bundle`).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

REDACTED = "<redacted>"

# Longest line the redactor looks at; a longer one is cut (and says so) before any pattern
# runs. The parsers have their own constant (kvops.parse._common.MAX_LINE_CHARS): this module
# runs on the host with the stdlib only and imports nothing from kvops.
MAX_LINE_CHARS = 16 * 1024
_CUT = " ...<line cut by the redactor>"

# Names whose value is a secret. PASS must end the word (REDIS_PASS, PGPASSWORD, passwd) so that
# e.g. IOMMU "passthrough" settings stay readable.
_SECRET_WORD = (
    r"(?:TOKEN(?!S|IZER|_?ID)|SECRET|PASS(?:WORD|WD|PHRASE)?(?![A-Za-z])|CREDENTIAL|API[_-]?KEY|ACCESS[_-]?KEY"
    r"|PRIVATE[_-]?KEY|AUTH(?:ORIZATION)?(?![A-Za-z])|DATABASE[_-]?URL|(?<![A-Za-z])DSN"
    r"(?![A-Za-z])|COOKIE|SESSION[_-]?KEY)"
)
SECRET_NAME = re.compile(_SECRET_WORD, re.I)

# Every pattern below is linear in the length of the text: a name is matched only from where a
# run of name characters starts (the look-behinds), and whether it is secret is decided by one
# look-ahead over that run. The former `[name chars]* SECRET [name chars]*` was tried from every
# position of a run and backtracked through it: 32 KB of crafted text took 105 s.
_NAME_CHARS = r"A-Za-z0-9_.\-"
_SECRET_RUN = r"(?=[" + _NAME_CHARS + r"]*?" + _SECRET_WORD + r")[" + _NAME_CHARS + r"]+"
_SCHEME_CHARS = r"A-Za-z0-9+.\-"
# scheme://userinfo@ (RFC 3986 §3.2.1); the scheme is a run of scheme characters with a letter
_URL_USERINFO = re.compile(
    r"(?<![" + _SCHEME_CHARS + r"])([" + _SCHEME_CHARS + r"]*://)([^\s/@'\"<>]+)@"
)
_HAS_LETTER = re.compile(r"[A-Za-z]")
# An HTTP credential: `Bearer <token>` / `Basic <base64>` (RFC 6750 §2.1, RFC 7617 §2)
_AUTH_SCHEME = r"(?:bearer|basic|token|digest)[ \t]+[^\s,;\"']+"
# key=value, key: value, "key": "value", 'key' = 'value', 'key': ['v1', 'v2'],
# Authorization: Bearer <token>
_ASSIGN = re.compile(
    r"(?<![" + _NAME_CHARS + r"])(?P<key>([\"']?)" + _SECRET_RUN + r"\2)"
    r"(?P<sep>[ \t]*[:=][ \t]*)"
    r"(?P<value>" + _AUTH_SCHEME + r"|\[[^\[\]\n]*\]"
    r"|\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s,;}\]\"']+)",
    re.I,
)
# A token after `Bearer` anywhere (a logged header without its name)
_BEARER = re.compile(
    r"(?<![A-Za-z])(?P<key>bearer)(?P<sep>[ \t]+)(?P<value>[A-Za-z0-9\-._~+/]+=*)", re.I
)
# --api-key VALUE (a flag, then whitespace, then a word that is not another flag)
_FLAG_WORD = re.compile(
    r"(?<![" + _NAME_CHARS + r"])(?P<key>-" + _SECRET_RUN + r")(?P<sep>[ \t]+)(?P<value>(?!-)\S+)",
    re.I,
)
# A YAML key with nothing after it on its line but a block indicator (`api_key:`,
# `hf_token: |`), or a pretty-printed JSON key opening a list or object (`"api_key": [`): its
# value is the lines below that are more indented, or YAML list items.
_YAML_BLOCK_KEY = re.compile(
    r"(?P<indent>[ \t]*)(?:-[ \t]+)?([\"']?)(?P<name>[" + _NAME_CHARS + r"]+)\2[ \t]*:"
    r"[ \t]*(?:[|>][-+0-9]*[ \t]*|[\[{][ \t]*)?(?:#.*)?"
)


def _keep_quotes(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    if len(value) >= 2 and value[0] == "[" and value[-1] == "]":
        return "[" + REDACTED + "]"
    return REDACTED


def _assignment(match: "re.Match[str]") -> str:
    value = match.group("value")
    if value.startswith(("<redacted>", '"<redacted>"', "'<redacted>'", "[<redacted>]")):
        return match.group(0)
    return match.group("key") + match.group("sep") + _keep_quotes(value)


def _userinfo(match: "re.Match[str]") -> str:
    if not _HAS_LETTER.search(match.group(1)):  # a scheme starts with a letter
        return match.group(0)
    return match.group(1) + REDACTED + "@"


def _cap_lines(text: str) -> str:
    """Every line cut to MAX_LINE_CHARS (the text itself when none is longer)."""
    lines = text.split("\n")
    if all(_short(line) for line in lines):
        return text
    return "\n".join(ln if _short(ln) else ln[: MAX_LINE_CHARS - len(_CUT)] + _CUT for ln in lines)


def _short(line: str) -> bool:
    """Within the cap; a line this redactor cut once, then lengthened by `<redacted>`, stays
    (redacting twice changes nothing)."""
    return len(line) <= MAX_LINE_CHARS or (line.endswith(_CUT) and len(line) <= 4 * MAX_LINE_CHARS)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _hide_yaml_blocks(text: str) -> str:
    """The lines of a secret-named YAML key's block or list value replaced (`api_key:` then
    `  - sk-...`; `hf_token: |` then `  abc`), so the value never reaches the evidence."""
    if "\n" not in text:
        return text
    out: List[str] = []
    block_indent = -1  # the indentation of the secret key whose block is being hidden
    for line in text.split("\n"):
        if block_indent >= 0:
            indent = _indent(line)
            item = line[indent:].startswith("-")
            if not line.strip() or indent > block_indent or (indent == block_indent and item):
                out.append(_hidden(line, indent, item) if line.strip() else line)
                continue
            block_indent = -1
        key = _YAML_BLOCK_KEY.fullmatch(line)
        if key is not None and SECRET_NAME.search(key.group("name")):
            block_indent = len(key.group("indent"))
        out.append(line)
    return "\n".join(out)


def _hidden(line: str, indent: int, item: bool) -> str:
    if line.strip() in (REDACTED, "- " + REDACTED):
        return line
    return line[:indent] + ("- " if item else "") + REDACTED


def redact_text(text: str) -> str:
    """Free text with every secret value replaced (idempotent)."""
    text = _hide_yaml_blocks(_cap_lines(text))
    text = _URL_USERINFO.sub(_userinfo, text)
    text = _ASSIGN.sub(_assignment, text)
    text = _BEARER.sub(_assignment, text)
    return _FLAG_WORD.sub(_assignment, text)


def redact_env(env: Dict[str, str]) -> Dict[str, str]:
    """Environment: secret-named variables hidden whole, URL credentials in all others."""
    return {k: (REDACTED if SECRET_NAME.search(k) else redact_text(v)) for k, v in env.items()}


def redact_argv(argv: List[str]) -> List[str]:
    """argv word by word: `--api-key VALUE` hides VALUE, every word is also redacted as text
    (so the `--kv-transfer-config` JSON keeps its shape with its secrets replaced)."""
    out: List[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        flag, sep, _ = arg.partition("=")
        if arg.startswith("-") and SECRET_NAME.search(flag):
            if sep:
                out.append(flag + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


def redact_value(value: Any) -> Any:
    """Structured data (a rendered LMCache config, a connector's JSON, a deploy record): a
    secret-named key hides its whole value, every other string is redacted as text, and the
    shape is kept (so a report can still show which keys were set)."""
    if isinstance(value, dict):
        return {
            k: (REDACTED if isinstance(k, str) and SECRET_NAME.search(k) else redact_value(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
