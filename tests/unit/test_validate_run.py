"""`kvops validate` as one request and one call: what scripts and the CLI both drive."""

from __future__ import annotations

from pathlib import Path

import evidence_builders as eb
import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.errors import RC, KvopsError
from kvops.validate.judge import EvidenceError
from kvops.validate.run import ValidateRequest, run_validate


def test_a_saved_bundle_is_judged_and_saved_again(tmp_path: Path) -> None:
    lines: list[str] = []
    req = ValidateRequest(from_dir=eb.EVIDENCE_DIR / "broken", save_dir=tmp_path / "again")
    outcome = run_validate(req, lines.append)
    assert outcome.fleet.exit_code() is RC.FAIL
    assert outcome.probes == [] and outcome.transport() == {}
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == sorted(
        p.name for p in (eb.EVIDENCE_DIR / "broken").glob("*.json")
    )
    assert lines[0].startswith("judging ") and lines[-1].startswith("saved ")


def test_an_unreadable_bundle_is_a_could_not_run_error(tmp_path: Path) -> None:
    with pytest.raises(EvidenceError) as caught:
        run_validate(ValidateRequest(from_dir=tmp_path / "missing"))
    assert isinstance(caught.value, KvopsError) and caught.value.rc is RC.COULD_NOT_RUN


def test_an_inventory_without_hosts_to_probe_still_gives_a_fleet(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1:\n      ansible_connection: local\n")
    req = ValidateRequest(inventories=(str(inventory),), limit="nosuchhost")
    with pytest.raises(KvopsError, match="nosuchhost"):
        run_validate(req)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-evidence", "x", "-i", "inv"], "drop -i/--limit"),
        ([], "give an inventory"),
    ],
)
def test_conflicting_options_are_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["validate", *args])
    assert result.exit_code == 2 and message in result.output
