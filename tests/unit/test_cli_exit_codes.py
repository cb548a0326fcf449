"""Every command exits with the one table of codes (README "Exit codes"), whatever went wrong.

0 OK, 1 FAIL, 2 could not run (usage, unreadable input, unreachable target), 130 interrupted;
a command-level error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click
import evidence_builders as eb
import pytest
from click.testing import CliRunner, Result
from test_smoke import lmcache_evidence

from kvops.cli import main
from kvops.cli.group import KvopsGroup
from kvops.errors import RC, KvopsError
from kvops.smoke.judge import SmokeEvidence
from kvops.smoke.run import SmokeError


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_the_codes_are_the_documented_numbers() -> None:
    assert [int(c) for c in (RC.OK, RC.FAIL, RC.COULD_NOT_RUN, RC.INTERRUPTED)] == [0, 1, 2, 130]
    assert KvopsError("x").rc is RC.COULD_NOT_RUN
    assert KvopsError("x", rc=RC.INTERRUPTED).rc is RC.INTERRUPTED


def _group_with(action: click.Command) -> click.Group:
    group = KvopsGroup("kvops")
    group.add_command(action)
    return group


@pytest.mark.parametrize(
    ("raised", "returned", "code", "line"),
    [
        (None, RC.FAIL, 1, None),
        (None, None, 0, None),
        (KvopsError("the disk is gone"), None, 2, "kvops demo: error: the disk is gone"),
        (KvopsError("stopped", rc=RC.INTERRUPTED), None, 130, "kvops demo: error: stopped"),
        (KeyboardInterrupt(), None, 130, "kvops demo: interrupted"),
    ],
)
def test_the_group_turns_results_and_errors_into_codes(
    raised: BaseException | None, returned: RC | None, code: int, line: str | None
) -> None:
    @click.command("demo")
    def demo() -> RC | None:
        if raised is not None:
            raise raised
        return returned

    result = CliRunner().invoke(_group_with(demo), ["demo"])
    assert result.exit_code == code
    if line is not None:
        assert result.output.strip().splitlines() == [line]
    assert "Traceback" not in result.output


def _smoke_gives(monkeypatch: pytest.MonkeyPatch, outcome: SmokeEvidence | BaseException) -> None:
    def fake_run_smoke(*_args: object) -> SmokeEvidence:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    # kvops.cli's `smoke` attribute is the command, so reach the module itself
    monkeypatch.setattr(importlib.import_module("kvops.cli.smoke"), "run_smoke", fake_run_smoke)


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        (lmcache_evidence(), 0),
        (lmcache_evidence(new_files=()), 1),
        (SmokeError("cannot reach http://x:8000"), 2),
        (KeyboardInterrupt(), 130),
    ],
)
def test_smoke_codes(
    monkeypatch: pytest.MonkeyPatch, outcome: SmokeEvidence | BaseException, code: int
) -> None:
    _smoke_gives(monkeypatch, outcome)
    assert _run("smoke", "--url", "http://x:8000", "--gds-dir", "/data/kv").exit_code == code


def test_smoke_could_not_run_is_a_json_document_and_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _smoke_gives(monkeypatch, SmokeError("cannot reach http://x:8000"))
    result = CliRunner().invoke(main, ["smoke", "--url", "http://x:8000", "--json"])
    assert result.exit_code == 2
    assert '"exit_code": 2' in result.stdout and "cannot reach" in result.stdout
    assert result.stderr.strip() == "kvops smoke: error: cannot reach http://x:8000"


def test_sim_run_that_cannot_run_is_2() -> None:
    result = _run("sim", "run", "--model", "llama-3.1-70b", "--gpu", "l40s-48gb")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("kvops sim run: error: ")


def test_sim_serve_with_a_refused_lmcache_config_is_2(tmp_path: Path) -> None:
    config = tmp_path / "lmcache.yaml"
    config.write_text("chunk_size: -1\n")
    result = CliRunner(env={"LMCACHE_CONFIG_FILE": str(config)}).invoke(
        main,
        ["sim", "serve", "--kv-transfer-config", '{"kv_connector":"LMCacheConnectorV1"}'],
    )
    assert result.exit_code == 2, result.output
    assert "kvops sim serve: error: LMCache configuration:" in result.output


def test_sim_unknown_profile_is_a_usage_error() -> None:
    assert _run("sim", "run", "--gpu", "no-such-gpu").exit_code == 2


def test_validate_codes_from_saved_bundles(tmp_path: Path) -> None:
    assert _run("validate", "--from-evidence", str(eb.EVIDENCE_DIR / "healthy")).exit_code == 0
    assert _run("validate", "--from-evidence", str(eb.EVIDENCE_DIR / "broken")).exit_code == 1
    assert _run("validate", "--from-evidence", str(eb.EVIDENCE_DIR / "fleet")).exit_code == 2
    missing = _run("validate", "--from-evidence", str(tmp_path / "none"))
    assert missing.exit_code == 2
    assert missing.output.startswith("kvops validate: error: ")
    assert _run("validate").exit_code == 2  # neither -i nor --from-evidence


def test_parse_codes(tmp_path: Path) -> None:
    good = tmp_path / "mounts"
    good.write_text("proc /proc proc rw 0 0\n")
    bad = tmp_path / "cufile.json"
    bad.write_text("{ not json")
    assert _run("parse", "mounts", str(good)).exit_code == 0
    assert _run("parse", "cufile", str(bad)).exit_code == 1
    assert _run("parse", "mounts", str(tmp_path / "missing")).exit_code == 2


def test_ab_test_usage_error_is_2() -> None:
    assert _run("ab-test", "--arm", "only=http://x:1").exit_code == 2


@pytest.mark.skipif(sys.platform != "linux", reason="the lab is Linux-only")
def test_lab_that_cannot_run_here_is_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvops.lab.lab.os.geteuid", lambda: 1000)
    result = _run("lab", "down")
    assert result.exit_code == 2
    assert result.output.startswith("kvops lab down: error: the lab cannot run here")
