"""Pure entry for `kvops validate`: judge evidence documents, and save/load evidence bundles.

The CLI (probe + SSH) produces evidence; everything here works on plain dicts, so a bundle
saved with `--save-evidence DIR` is judged again offline with `--from-evidence DIR` exactly
as it was live.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvops import evidence as ev
from kvops.checks import (
    ALL_CHECKS,
    Context,
    Finding,
    Severity,
    Thresholds,
)
from kvops.checks.fleet import FleetResult
from kvops.checks.model import finding
from kvops.checks.ontap import OntapThresholds, judge_ontap, lif_owners
from kvops.checks.shared_store import judge_shared_stores
from kvops.errors import KvopsError


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


def judge_fleet(
    documents: Iterable[Mapping[str, Any]],
    thresholds: Thresholds | None = None,
    strict: bool = False,
    clusters: Sequence[Mapping[str, Any]] = (),
    storage_addresses: Mapping[str, str] | None = None,
    ontap_thresholds: OntapThresholds | None = None,
) -> FleetResult:
    """Every host's findings, then the findings across hosts (offload hosts sharing one GDS
    directory: kvops/checks/shared_store.py), then every ONTAP cluster's (`--ontap`, or a
    bundle that holds cluster documents) judged in the same pass against the same host
    documents: a cluster's findings go under its name, its findings about a GPU host's mount
    after that host's own."""
    hosts = list(documents)
    result = FleetResult(strict=strict)
    for document in hosts:
        host = str(document.get("host") or "?")
        result.findings[host] = judge(document, thresholds)
        if document.get("error"):
            result.unreachable.append(host)
    try:
        owners = {a: o for cluster in clusters for a, o in lif_owners(cluster).items()}
        shared = judge_shared_stores(hosts, owners)
    except Exception as exc:  # a judge bug must not hide the hosts' own findings
        crashed = Finding("GDS-090", Severity.FAIL, "Check crashed", f"shared stores: {exc!r}")
        shared = {h: [crashed] for h in result.findings if h not in result.unreachable}
    for host, findings in shared.items():
        result.findings.setdefault(host, []).extend(_with_host(f, host) for f in findings)
    for cluster in clusters:
        judged = judge_ontap(cluster, hosts, storage_addresses, ontap_thresholds)
        for host, findings in judged.items():
            result.findings.setdefault(host, []).extend(findings)
    return result


def _file_name(host: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".json"


def save_evidence(directory: Path, documents: Iterable[Mapping[str, Any]]) -> list[Path]:
    """One JSON file per host (`<host>.json`), so a bundle diffs and greps per host.

    The documents hold the service's environment, unit, argv and configs (secrets redacted on
    the host, but still an inventory of the site), so a new directory is 0700 and every file
    0600, written without following a link planted at its name."""
    if not directory.exists():
        directory.mkdir(parents=True, mode=0o700)
        directory.chmod(0o700)  # mkdir's mode is masked by the umask
    paths = []
    names: dict[str, str] = {}
    for document in documents:
        host = str(document.get("host") or "unknown")
        name = _file_name(host)
        if name in names:
            raise EvidenceError(f"{directory / name}: hosts {names[name]!r} and {host!r} map to it")
        names[name] = host
        path = directory / name
        data = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise EvidenceError(f"{path}: cannot write ({exc.strerror or exc})") from exc
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)  # an existing file keeps its mode otherwise
            fh.write(data)
        paths.append(path)
    return paths


class EvidenceError(KvopsError):
    """A bundle that cannot be read: the CLI turns this into exit 2 with the message."""


def load_evidence(directory: Path) -> list[dict[str, Any]]:
    """Every `*.json` in the directory, sorted by name. Raises EvidenceError naming the file."""
    if not directory.is_dir():
        raise EvidenceError(f"{directory}: not a directory")
    documents = []
    seen: dict[str, Path] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise EvidenceError(f"{path}: cannot read ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise EvidenceError(f"{path}: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
        if not isinstance(document, dict) or "host" not in document:
            raise EvidenceError(f"{path}: not an evidence document (no 'host')")
        host = str(document["host"])
        if host in seen:
            raise EvidenceError(
                f"{path}: host {host!r} already read from {seen[host].name}; "
                "one evidence document per host (which one is true?)"
            )
        seen[host] = path
        documents.append(document)
    if not documents:
        raise EvidenceError(f"{directory}: no *.json evidence files")
    return documents
