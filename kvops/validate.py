"""Pure entry for `kvops validate`: judge evidence documents, and save/load evidence bundles.

The CLI (probe + SSH) produces evidence; everything here works on plain dicts, so a bundle
saved with `--save-evidence DIR` is judged again offline with `--from-evidence DIR` exactly
as it was live.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops import evidence as ev
from kvops.checks import ALL_CHECKS, SEVERITY_ORDER, Context, Finding, Severity, Thresholds
from kvops.checks.model import finding
from kvops.errors import RC, KvopsError


def judge(evidence: Mapping[str, Any], thresholds: Thresholds | None = None) -> list[Finding]:
    """All checks on one host's evidence. A host that could not be probed yields one FAIL
    (GDS-000); a check that crashes on odd evidence yields a FAIL naming the check instead
    of taking the whole run down."""
    host = str(evidence.get("host") or "?")
    thresholds = thresholds or Thresholds()
    error = evidence.get("error")
    version = evidence.get("schema_version")
    if error:
        return [_with_host(finding("GDS-000", Severity.FAIL, f"not probed: {error}"), host)]
    findings: list[Finding] = []
    if version != ev.SCHEMA_VERSION:
        msg = f"evidence schema_version {version!r}, this kvops reads {ev.SCHEMA_VERSION}"
        findings.append(finding("GDS-000", Severity.WARN, msg))
    else:
        when, probe = evidence.get("collected_at", "?"), evidence.get("probe_version", "?")
        msg = f"probed at {when} (probe {probe})"
        findings.append(finding("GDS-000", Severity.PASS, msg))
    ctx = Context(dict(evidence), thresholds)
    for check in ALL_CHECKS:
        try:
            findings.extend(check(ctx))
        except Exception as exc:  # a judge bug must not hide the other findings
            name = getattr(check, "__name__", "check")
            findings.append(
                Finding("GDS-000", Severity.FAIL, "Check crashed", f"{name}: {exc!r}", "", "")
            )
    return [_with_host(f, host) for f in findings]


def _with_host(item: Finding, host: str) -> Finding:
    return Finding(
        item.check_id, item.severity, item.title, item.message, item.evidence, item.remedy, host
    )


@dataclass
class FleetResult:
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)

    def host_status(self, host: str) -> Severity:
        return worst(f.severity for f in self.findings.get(host, []))

    def counts(self) -> dict[str, int]:
        """Hosts per worst severity, e.g. {"PASS": 3, "WARN": 1, "FAIL": 0, "SKIP": 0}."""
        out = {str(s): 0 for s in SEVERITY_ORDER}
        for host in self.findings:
            out[str(self.host_status(host))] += 1
        return out

    def exit_code(self) -> RC:
        """OK all pass, FAIL any FAIL, COULD_NOT_RUN some host could not be probed."""
        if self.unreachable:
            return RC.COULD_NOT_RUN
        failed = any(f.severity is Severity.FAIL for fs in self.findings.values() for f in fs)
        return RC.FAIL if failed else RC.OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "hosts": {
                host: {
                    "status": str(self.host_status(host)),
                    "findings": [f.to_dict() for f in items],
                }
                for host, items in self.findings.items()
            },
            "unreachable": list(self.unreachable),
            "summary": self.counts(),
            "exit_code": int(self.exit_code()),
        }


def worst(severities: Iterable[Severity]) -> Severity:
    seen = set(severities)
    return next((s for s in SEVERITY_ORDER if s in seen), Severity.SKIP)


def judge_fleet(
    documents: Iterable[Mapping[str, Any]], thresholds: Thresholds | None = None
) -> FleetResult:
    result = FleetResult()
    for document in documents:
        host = str(document.get("host") or "?")
        result.findings[host] = judge(document, thresholds)
        if document.get("error"):
            result.unreachable.append(host)
    return result


def _file_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".json"


def save_evidence(directory: Path, documents: Iterable[Mapping[str, Any]]) -> list[Path]:
    """One JSON file per host (`<host>.json`), so a bundle diffs and greps per host."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for document in documents:
        path = directory / _file_name(str(document.get("host") or "unknown"))
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


class EvidenceError(KvopsError):
    """A bundle that cannot be read: the CLI turns this into exit 2 with the message."""


def load_evidence(directory: Path) -> list[dict[str, Any]]:
    """Every `*.json` in the directory, sorted by name. Raises EvidenceError naming the file."""
    if not directory.is_dir():
        raise EvidenceError(f"{directory}: not a directory")
    documents = []
    for path in sorted(directory.glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise EvidenceError(f"{path}: cannot read ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise EvidenceError(f"{path}: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
        if not isinstance(document, dict) or "host" not in document:
            raise EvidenceError(f"{path}: not an evidence document (no 'host')")
        documents.append(document)
    if not documents:
        raise EvidenceError(f"{directory}: no *.json evidence files")
    return documents
