"""judge_fleet, evidence bundles on disk, the catalog, and the findings renderers."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import evidence_builders as eb
import pytest
from rich.console import Console

from kvops.checks import ALL_CHECKS, Context, Severity, Thresholds
from kvops.checks.catalog import (
    _ROWS,
    CATALOG,
    catalog_markdown,
    catalog_rows,
    fleet_check_ids,
    validate_check_ids,
)
from kvops.report.findings import render_terminal, to_json, to_junit
from kvops.validate.judge import (
    EvidenceError,
    Finding,
    judge,
    judge_fleet,
    load_evidence,
    save_evidence,
)


def test_catalog_ids_unique_and_well_formed() -> None:
    ids = [row[0] for row in _ROWS]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"(GDS|ONT)-\d{3}", i) for i in ids)
    assert [r.check_id for r in catalog_rows()] == sorted(ids)
    assert all(r.title and r.remedy for r in CATALOG.values())
    table = catalog_markdown().splitlines()
    assert len(table) == 2 + len(CATALOG) and table[2].startswith("| GDS-000 | host |")


def test_saved_bundles_match_the_builders(tmp_path: Path) -> None:
    eb.write_bundles(tmp_path)
    for saved in sorted(eb.EVIDENCE_DIR.glob("*/*.json")):
        fresh = tmp_path / saved.relative_to(eb.EVIDENCE_DIR)
        assert fresh.read_text() == saved.read_text(), f"regenerate: {saved}"


def test_fleet_bundle_exit_codes() -> None:
    fleet = judge_fleet(load_evidence(eb.EVIDENCE_DIR / "fleet"))
    assert fleet.unreachable == ["unreachable"]
    assert fleet.exit_code() == 2
    assert fleet.counts() == {"FAIL": 8, "WARN": 3, "PASS": 1, "SKIP": 0}
    assert judge_fleet(load_evidence(eb.EVIDENCE_DIR / "healthy")).exit_code() == 0
    assert judge_fleet(load_evidence(eb.EVIDENCE_DIR / "broken")).exit_code() == 1


def test_save_then_load_round_trip(tmp_path: Path) -> None:
    docs = [eb.healthy(), eb.unreachable()]
    docs[1]["host"] = "odd/host name"
    paths = save_evidence(tmp_path / "bundle", docs)
    assert [p.name for p in paths] == ["netapp-rdma-ok.json", "odd_host_name.json"]
    assert load_evidence(tmp_path / "bundle") == docs


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "no *.json evidence files"),
        ("{not json", "line 1 column 2"),
        ('{"items": {}}', "no 'host'"),
    ],
)
def test_load_errors_name_the_problem(tmp_path: Path, content: str | None, error: str) -> None:
    if content is not None:
        (tmp_path / "h.json").write_text(content)
    with pytest.raises(EvidenceError, match=re.escape(error)):
        load_evidence(tmp_path)
    with pytest.raises(EvidenceError, match="not a directory"):
        load_evidence(tmp_path / "missing")


def test_newer_schema_version_warns() -> None:
    doc = eb.healthy()
    doc["schema_version"] = 2
    first = judge(doc)[0]
    assert (first.check_id, first.severity) == ("GDS-000", Severity.WARN)


def test_a_crashing_check_becomes_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Context) -> list[Finding]:
        raise KeyError("surprise")

    normal = judge(eb.healthy())
    monkeypatch.setattr("kvops.validate.judge.ALL_CHECKS", [broken, *ALL_CHECKS])
    findings = judge(eb.healthy(), Thresholds())
    crashed = [f for f in findings if f.title == "Check crashed"]
    assert len(crashed) == 1 and "broken" in crashed[0].message
    assert findings[:1] + findings[2:] == normal  # the other checks still ran


def fleet() -> Any:
    return judge_fleet(
        [eb.healthy(), eb.compat_only(), eb.misspelled_cufile_key(), eb.unreachable()]
    )


def test_json_report_round_trips_findings() -> None:
    document = json.loads(to_json(fleet()))
    assert document["exit_code"] == 2
    assert document["hosts"]["compat-only"]["status"] == "FAIL"
    restored = [Finding.from_dict(f) for f in document["hosts"]["compat-only"]["findings"]]
    assert restored == fleet().findings["compat-only"]


def test_junit_one_testcase_per_host_and_check() -> None:
    root = ET.fromstring(to_junit(fleet()))
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    compat = suites["compat-only"]
    assert compat.get("failures") == "2"
    failed = {c.get("name", "").split()[0] for c in compat if c.find("failure") is not None}
    assert failed == {"GDS-040", "GDS-051"}
    cases = [c.get("name", "").split()[0] for c in suites["misspelled-cufile-key"]]
    # one case per check id: the host's own, and those judged across the fleet
    assert len(cases) == len(set(cases)) == len(validate_check_ids() | fleet_check_ids())
    warned = next(
        c for c in suites["misspelled-cufile-key"] if c.get("name", "").startswith("GDS-031")
    )
    assert "[WARN]" in (warned.findtext("system-out") or "")
    assert suites["unreachable"].get("failures") == "1"


def test_terminal_report_lists_problems_and_summary() -> None:
    console = Console(width=200, record=True)
    render_terminal(fleet(), console, problems_only=True)
    text = console.export_text()
    assert "GDS-040" in text and "GDS-031" in text
    assert "GDS-001" not in text  # PASS rows hidden with problems_only
    assert "4 hosts: 1 pass, 1 warn, 2 fail, 1 not probed" in text
