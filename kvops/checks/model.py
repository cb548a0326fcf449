"""Findings, severities and the thresholds the judges compare against."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from kvops.checks.catalog import CATALOG


class Severity(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


# Worst first: a host's status is its worst finding.
SEVERITY_ORDER = (Severity.FAIL, Severity.WARN, Severity.PASS, Severity.SKIP)


@dataclass(frozen=True)
class Finding:
    check_id: str
    severity: Severity
    title: str
    message: str
    evidence: str = ""
    remedy: str = ""
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["severity"] = str(self.severity)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(
            check_id=str(data["check_id"]),
            severity=Severity(data["severity"]),
            title=str(data.get("title", "")),
            message=str(data.get("message", "")),
            evidence=str(data.get("evidence", "")),
            remedy=str(data.get("remedy", "")),
            host=str(data.get("host", "")),
        )


def finding(
    check_id: str,
    severity: Severity,
    message: str,
    evidence: str = "",
    remedy: str | None = None,
) -> Finding:
    """A finding with the catalog's title; the catalog remedy unless the check gives a
    sharper one. PASS and SKIP carry no remedy: there is nothing to do."""
    info = CATALOG[check_id]
    if severity in (Severity.PASS, Severity.SKIP):
        remedy = ""
    elif remedy is None:
        remedy = info.remedy
    return Finding(check_id, severity, info.title, message, excerpt(evidence), remedy)


def excerpt(text: str, max_lines: int = 8, max_chars: int = 600) -> str:
    """Bound an evidence excerpt: reports show why, not the whole tool output."""
    lines = [ln.rstrip() for ln in text.strip().splitlines()][:max_lines]
    out = "\n".join(lines)
    return out if len(out) <= max_chars else out[: max_chars - 3] + "..."


@dataclass(frozen=True)
class Thresholds:
    """Operator-tunable limits. Defaults are documented choices, not hardware facts."""

    min_driver_version: str = "535.54"
    # gdscheck >= 1.16 prints "nvidia_fs minimum version: 2.12"
    min_nvidia_fs_version: str = "2.12"
    # nvidia-fs 2.17.5 dropped symbol_get for nvidia_p2p_*: open kernel module only.
    open_module_required_from_nvfs: str = "2.17.5"
    nfs_versions_over_rdma: tuple[str, ...] = ("3", "4", "4.0", "4.1")
    min_nfs_rw_size_bytes: int = 65536
    bench_min_link_share: float = 0.70
    # Small random IO is IOPS-bound: only runs with IO of at least this size are compared
    # with the link rate.
    bench_min_io_size_kib: int = 1024
    min_free_gib: float = 10.0
    # The fill level at which a GDS directory's file system WARNs (GDS-083): llm-d's PVC
    # evictor starts cleaning at 85% (llm-d/llm-d-kv-cache kv_connectors/pvc_evictor/README.md).
    max_fill_percent: float = 85.0
