"""A fleet's findings, host by host, and what they add up to: each host's worst severity, the
counts, the exit code (with `--strict`, what the path-proving checks left unproven).

Why here, beside the findings: `kvops validate` and `kvops smoke` both fill one, and the
renderers (`kvops.report.findings`) read it; none of them needs the judge that fills it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvops.checks.catalog import CATALOG
from kvops.checks.model import SEVERITY_ORDER, Finding, Severity
from kvops.errors import RC

# The checks that prove GDS really carries the I/O (`--strict`): the GDS platform (gdscheck,
# IOMMU, PCIe placement), the storage bench (gdsio + nvidia-fs counters) and compat mode.
# Without --strict their WARN/SKIP pass a gate as "not disproven"; with it they fail it.
STRICT_CONCERNS = frozenset({"gds_platform", "storage_bench"})
STRICT_CHECK_IDS = frozenset({"GDS-032"})


def proves_path(check_id: str) -> bool:
    info = CATALOG.get(check_id)
    return check_id in STRICT_CHECK_IDS or (info is not None and info.concern in STRICT_CONCERNS)


@dataclass
class FleetResult:
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)
    strict: bool = False

    def unproven(self) -> list[Finding]:
        """WARN/SKIP findings of the path-proving checks (what `--strict` turns into exit 1)."""
        return [
            f
            for items in self.findings.values()
            for f in items
            if f.severity in (Severity.WARN, Severity.SKIP) and proves_path(f.check_id)
        ]

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
        if self.strict and self.unproven():
            failed = True
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
            "strict": self.strict,
            "unproven": [f"{f.host} {f.check_id} {f.severity}" for f in self.unproven()],
            "summary": self.counts(),
            "exit_code": int(self.exit_code()),
        }


def worst(severities: Iterable[Severity]) -> Severity:
    seen = set(severities)
    return next((s for s in SEVERITY_ORDER if s in seen), Severity.SKIP)
