"""`kvops smoke` reports like `kvops validate`: findings with catalog ids in the table and JUnit."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_cli_exit_codes import _smoke_gives
from test_smoke import lmcache_evidence

from kvops.cli import main


def test_table_lists_ids_and_the_verdict_and_junit_has_one_case_per_check(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _smoke_gives(monkeypatch, lmcache_evidence(new_files=()))
    junit = tmp_path / "ci" / "smoke.xml"
    result = CliRunner().invoke(
        main, ["smoke", "--url", "http://x:8000", "--gds-dir", "/d", "--junit", str(junit)]
    )
    assert result.exit_code == 1
    assert "GDS-206" in result.stdout and "smoke: FAIL" in result.stdout
    assert "GDS-080" in result.stdout  # the catalog remedy points at validate's check
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "9" and suite.get("failures") == "1"
    failed = [c.get("name") for c in suite if c.find("failure") is not None]
    assert failed == ["GDS-206 New chunk files in the storage directory"]
