"""The issue's acceptance cases: the NetApp RDMA host passes; each broken host FAILs or WARNs
with the right id (and only the ids its defect explains)."""

from __future__ import annotations

from typing import Any

import evidence_builders as eb
import pytest

from kvops.checks import Severity
from kvops.checks.catalog import validate_check_ids
from kvops.validate.judge import judge


def problems(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (f.check_id, str(f.severity))
        for f in judge(doc)
        if f.severity in (Severity.FAIL, Severity.WARN)
    }


def test_netapp_rdma_host_passes_every_check() -> None:
    findings = judge(eb.healthy())
    assert {f.check_id for f in findings} == validate_check_ids()  # every check ran
    assert [f for f in findings if f.severity is not Severity.PASS] == []
    assert all(f.host == "netapp-rdma-ok" for f in findings)


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (eb.compat_only, {("GDS-040", "FAIL"), ("GDS-051", "FAIL")}),
        (eb.tcp_fallback, {("GDS-021", "FAIL"), ("GDS-060", "FAIL")}),
        (eb.proprietary_driver, {("GDS-002", "FAIL")}),
        (eb.misspelled_cufile_key, {("GDS-031", "WARN"), ("GDS-032", "WARN")}),
        (eb.wrong_lmcache_buffer_key, {("GDS-061", "FAIL")}),
        (eb.nic_across_host_bridge, {("GDS-043", "WARN")}),
        (eb.storage_nic_far, {("GDS-043", "WARN")}),
        (eb.use_gds_yes, {("GDS-065", "FAIL")}),
        (eb.lmcache_torch_fallback, {("GDS-066", "FAIL")}),
        (eb.gds_dir_hung, {("GDS-080", "FAIL")}),
    ],
)
def test_broken_host_is_flagged_with_the_right_id(build: Any, expected: set[Any]) -> None:
    assert problems(build()) == expected


def test_misspelled_key_finding_names_the_fix() -> None:
    [finding] = [f for f in judge(eb.misspelled_cufile_key()) if f.check_id == "GDS-031"]
    assert "properties.allow_compat_mod'" in finding.message
    assert (
        finding.remedy == "Rename 'properties.allow_compat_mod' to 'properties.allow_compat_mode'."
    )


def test_wrong_buffer_key_remedy() -> None:
    [finding] = [f for f in judge(eb.wrong_lmcache_buffer_key()) if f.check_id == "GDS-061"]
    assert finding.remedy == "Rename cufile_buffer_size to gds_buffer_size."


def test_unreachable_host_is_one_fail() -> None:
    [finding] = judge(eb.unreachable())
    assert (finding.check_id, finding.severity) == ("GDS-000", Severity.FAIL)
    assert "timed out" in finding.message


def test_empty_evidence_skips_instead_of_crashing() -> None:
    findings = judge({"schema_version": 1, "host": "bare", "items": {}})
    assert not [f for f in findings if f.title == "Check crashed"]
    assert {f.severity for f in findings if f.check_id != "GDS-000"} == {Severity.SKIP}
    assert all(f.message for f in findings)
