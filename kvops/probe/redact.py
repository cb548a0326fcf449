"""The one redactor: secrets are replaced on the host, before anything is printed.

Evidence bundles get saved, attached to tickets and pasted into chats, so every text the probe
records from the service (unit files, `systemctl show`, argv, environment, LMCache YAML, the
`--kv-transfer-config` JSON) passes through here. It covers the forms secrets take in practice:

- URL credentials anywhere: `redis://user:pw@host`, `HTTPS_PROXY=http://u:p@proxy` (RFC 3986
  §3.2.1 userinfo) → `redis://<redacted>@host`;
- a secret-named key with `=`, `:` or a JSON `"key": value` (`HF_TOKEN=...`, `api_key: ...`,
  `"api_key": "..."`, `REDIS_PASS=...`, `DATABASE_URL=...`);
- a secret-named command-line flag with its value as the next word (`--api-key VALUE`) or
  after `=`.

Runs on the target under Python >= 3.8 with the stdlib only (see `kvops.probe.bundle`).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

REDACTED = "<redacted>"

# Names whose value is a secret. PASS must end the word (REDIS_PASS, PGPASSWORD, passwd) so that
# e.g. IOMMU "passthrough" settings stay readable.
_SECRET_WORD = (
    r"(?:TOKEN(?!S|IZER|_?ID)|SECRET|PASS(?:WORD|WD|PHRASE)?(?![A-Za-z])|CREDENTIAL|API[_-]?KEY|ACCESS[_-]?KEY"
    r"|PRIVATE[_-]?KEY|AUTH(?:ORIZATION)?(?![A-Za-z])|DATABASE[_-]?URL|(?<![A-Za-z])DSN"
    r"(?![A-Za-z])|COOKIE|SESSION[_-]?KEY)"
)
SECRET_NAME = re.compile(_SECRET_WORD, re.I)
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^\s/@'\"<>]+)@")
_KEY = r"[A-Za-z0-9_.\-]*" + _SECRET_WORD + r"[A-Za-z0-9_.\-]*"
# key=value, key: value, "key": "value", 'key' = 'value'
_ASSIGN = re.compile(
    r"(?P<key>([\"']?)" + _KEY + r"\2)(?P<sep>[ \t]*[:=][ \t]*)"
    r"(?P<value>\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s,;}\]\"']+)",
    re.I,
)
# --api-key VALUE (a flag, then whitespace, then a word that is not another flag)
_FLAG_WORD = re.compile(r"(?P<key>--?" + _KEY + r")(?P<sep>[ \t]+)(?P<value>(?!-)\S+)", re.I)


def _keep_quotes(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + REDACTED + value[0]
    return REDACTED


def _assignment(match: "re.Match[str]") -> str:
    value = match.group("value")
    if value.startswith(("<redacted>", '"<redacted>"', "'<redacted>'")):
        return match.group(0)
    return match.group("key") + match.group("sep") + _keep_quotes(value)


def redact_text(text: str) -> str:
    """Free text with every secret value replaced (idempotent)."""
    text = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _ASSIGN.sub(_assignment, text)
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
