"""`kvops smoke` and every command's error line: what an engine or a host says is shown as text.

Issue 24: the engine names its models, writes its error bodies and, through its GDS directory,
the chunk file names smoke quotes. None of it may act on the operator's terminal or break the
table, the JSON or the JUnit file.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_smoke import lmcache_evidence

from kvops.cli import main
from kvops.smoke.judge import ChunkFile, SmokeEvidence
from kvops.smoke.run import SmokeError

HOSTILE = "[/] [bold red]PASS[/bold red] \x1b[2K\x1b[1A\x07 \x9b2J \r\x00\x7f \ud800\u202e end"
# Anything but LF and TAB: C0, DEL, C1, surrogates, bidi overrides.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def hostile_evidence() -> SmokeEvidence:
    bad = ChunkFile(f"/data/kv/{HOSTILE}.kvcache.safetensors", 10, "lmcache", False)
    return dataclasses.replace(lmcache_evidence(), model=HOSTILE, new_files=(bad,))


def smoke_gives(monkeypatch: pytest.MonkeyPatch, outcome: SmokeEvidence | SmokeError) -> None:
    def fake_run_smoke(_opts: object, progress: Callable[[str], None]) -> SmokeEvidence:
        progress(f"http://gpu1:8000: model {HOSTILE}, 3 prompts")
        if isinstance(outcome, SmokeError):
            raise outcome
        return outcome

    monkeypatch.setattr(importlib.import_module("kvops.cli.smoke"), "run_smoke", fake_run_smoke)


def test_smoke_table_progress_and_junit_show_hostile_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    smoke_gives(monkeypatch, hostile_evidence())
    junit = tmp_path / "smoke.xml"
    args = ["smoke", "--url", "http://gpu1:8000", "--gds-dir", "/d", "-v", "--junit", str(junit)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert not _UNSAFE.findall(result.stdout) and not _UNSAFE.findall(result.stderr)
    assert "model [/] [bold red]PASS[/bold red] \\x1b[2K\\x1b[1A\\x07" in result.stderr
    # the chunk file's name, in the table
    assert "/data/kv/[/] [bold" in result.stdout and "\\x1b[2K\\x1b[1A" in result.stdout
    assert "smoke: FAIL" in result.stdout
    root = ET.fromstring(junit.read_text(encoding="utf-8"))
    assert "\\x1b[2K" in ET.tostring(root, encoding="unicode")


def test_smoke_json_carries_hostile_text_escaped_by_json(monkeypatch: pytest.MonkeyPatch) -> None:
    smoke_gives(monkeypatch, hostile_evidence())
    result = CliRunner().invoke(main, ["smoke", "--url", "http://gpu1:8000", "--json"])
    assert not _UNSAFE.findall(result.stdout)
    assert "\\u009b2J" in result.stdout  # C1 as JSON's own escape
    document = json.loads(result.stdout)
    assert document["evidence"]["model"] == HOSTILE  # the data itself is intact


def test_an_error_line_quoting_an_engine_is_text(monkeypatch: pytest.MonkeyPatch) -> None:
    smoke_gives(monkeypatch, SmokeError(f"warm-up failed: {HOSTILE}"))
    result = CliRunner().invoke(main, ["smoke", "--url", "http://gpu1:8000"])
    assert result.exit_code == 2
    assert not _UNSAFE.findall(result.stderr)
    assert "kvops smoke: error: warm-up failed: [/] [bold red]PASS" in result.stderr
    assert "\\x1b[2K\\x1b[1A\\x07 \\x9b2J \\r\\x00\\x7f \\ud800\\u202e end" in result.stderr
