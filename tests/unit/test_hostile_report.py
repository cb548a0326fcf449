"""A hostile host's text reaches the operator as text: no markup, no terminal control, valid XML.

Issue 24: a compromised GPU host writes every string of its evidence (vLLM version, the probe's
stderr, log excerpts, the host name it reports). None of it may crash a report, act on the
operator's terminal, or make the JUnit file unparseable.
"""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import evidence_builders as eb
import pytest
from rich.console import Console

from kvops.checks import Finding, Severity
from kvops.checks.fleet import FleetResult
from kvops.remote.inventory import InventoryHost
from kvops.report.findings import host_table, render_terminal, to_json, to_junit
from kvops.report.host_text import markup, printable
from kvops.validate import collect, run
from kvops.validate.collect import HostResult, HostStatus, error_evidence
from kvops.validate.run import ValidateRequest

# Markup that crashes rich or restyles, cursor-up + erase-line, BEL, 8-bit CSI, CR, NUL, DEL,
# a lone surrogate (json.loads accepts "\ud800"), an XML non-character, a bidi override.
HOSTILE = (
    "[/] [bold red]PASS[/bold red] \x1b[2K\x1b[1A\x07 \x9b2J \r\x00\x7f \ud800\ufffe\u202e end"
)
ATTACKS = ("\x1b", "\x07", "\x9b", "\r", "\x00", "\x7f", "\ud800", "\ufffe", "\u202e")
HOSTS = ("gpu-ok", "evil\x1b[2K[/]host", "gpu-last")
# What rich itself writes on a colour terminal: SGR styles (ECMA-48 §8.3.117) and, for
# Console.print of a Table, nothing else.
_RICH_SGR = re.compile(r"\x1b\[[0-9;]*m")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def hostile_fleet() -> FleetResult:
    """Three hosts; the middle one put HOSTILE in every field it can reach."""
    ordinary = Finding("GDS-001", Severity.PASS, "NVIDIA driver", "driver 550.54.15", host="")
    findings: dict[str, list[Finding]] = {
        "gpu-ok": [ordinary],
        HOSTS[1]: [
            Finding(
                "GDS-070",
                Severity.FAIL,
                f"vLLM {HOSTILE}",
                f"version {HOSTILE}",
                evidence=f"stderr:\n{HOSTILE}\n\tlast line",
                remedy=f"see {HOSTILE}",
                host=HOSTS[1],
            ),
            Finding("GDS-071", Severity.WARN, HOSTILE, HOSTILE, evidence=HOSTILE, host=HOSTS[1]),
            Finding("GDS-072", Severity.SKIP, "skipped", HOSTILE, host=HOSTS[1]),
        ],
        "gpu-last": [
            Finding("GDS-070", Severity.FAIL, "vLLM", "not running", evidence="[/]", host="")
        ],
    }
    return FleetResult(findings=findings, unreachable=[])


def terminal(colour: bool) -> str:
    out = io.StringIO()
    console = Console(
        file=out, force_terminal=True, color_system="truecolor" if colour else None, width=160
    )
    fleet = hostile_fleet()
    render_terminal(fleet, console, verbose=True)
    console.print(host_table(HOSTS[1], fleet.findings[HOSTS[1]], verbose=True))
    return out.getvalue()


@pytest.mark.parametrize("colour", [True, False])
def test_terminal_shows_hostile_text_without_acting_on_it(colour: bool) -> None:
    text = terminal(colour)
    plain = _RICH_SGR.sub("", text)
    assert not _CONTROL.findall(plain), "a control character reached the terminal"
    assert not any(c in plain for c in ATTACKS)
    for shown in ("gpu-ok", "evil\\x1b[2K[/]host", "gpu-last"):
        assert shown in plain
    # The text still shows, its brackets and controls escaped rather than obeyed.
    assert "[bold red]PASS[/bold red]" in plain and "\\x1b[2K\\x1b[1A\\x07" in plain
    assert "\\x9b2J" in plain and "\\r\\x00\\x7f" in plain and "\\ud800\\ufffe\\u202e" in plain
    assert "3 hosts: 1 pass, 0 warn, 2 fail" in plain


def test_junit_of_a_hostile_fleet_parses_and_keeps_every_host() -> None:
    xml = to_junit(hostile_fleet())
    assert not _CONTROL.findall(xml.replace("\n", "").replace("\t", ""))
    root = ET.fromstring(xml)
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert list(suites) == ["gpu-ok", "evil\\x1b[2K[/]host", "gpu-last"]
    evil = suites["evil\\x1b[2K[/]host"]
    assert (evil.get("failures"), evil.get("skipped")) == ("1", "1")
    failure = evil.find("testcase/failure")
    assert failure is not None and failure.text is not None
    assert "\\x1b[2K" in str(failure.get("message")) and "[bold red]PASS" in failure.text
    assert "stderr:\n" in failure.text and "\n\tlast line" in failure.text  # excerpt's lines kept


def test_json_of_a_hostile_fleet_carries_the_text_exactly() -> None:
    """JSON is data for programs: the host's text travels as it came, escaped by JSON itself
    (RFC 8259 §7), and the document is plain ASCII."""
    text = to_json(hostile_fleet())
    assert text.isascii() and not _CONTROL.findall(text.replace("\n", ""))
    document: dict[str, Any] = json.loads(text)
    assert list(document["hosts"]) == sorted(HOSTS)
    evil = document["hosts"][HOSTS[1]]["findings"]
    assert evil[1]["message"] == HOSTILE


def test_ordinary_text_is_unchanged() -> None:
    for text in ("vLLM 0.8.5 [tp=2] /mnt/ontap", "a\n\tb", "ünïcode ✓ 日本", ""):
        assert printable(text) == text
    assert printable("a\nb", one_line=True) == "a\\nb"
    assert markup("[bold]x[/]") == "\\[bold]x\\[/]"
    assert printable("\x1b[2K\x9b\r") == "\\x1b[2K\\x9b\\r"


def test_progress_lines_quote_a_hostile_probe_as_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvops validate`'s progress: the reason of a failed probe ends with the host's last
    stderr line. A `[/]` there used to raise MarkupError in the worker that reported it, and
    that worker's remaining hosts vanished from the report."""
    names = [f"gpu-{i}" for i in range(5)]
    hosts = [InventoryHost(n, vars={"ansible_connection": "ssh"}) for n in names]
    hosts[0].warnings.append(f"kvops_role {HOSTILE!r} unknown")
    monkeypatch.setattr(run, "load_inventory", lambda *a: hosts)

    def probe_host(host: InventoryHost, config: dict[str, Any], opts: Any) -> HostResult:
        if host.name == "gpu-1":
            doc = eb.healthy()
            doc["host"] = host.name  # as probe_host sets it
            return HostResult(host.name, HostStatus.OK, doc, duration_s=1.0)
        reason = f"probe on {host.name} exited 1 without evidence: {HOSTILE}"
        return HostResult(
            host.name, HostStatus.PROBE_FAILED, error_evidence(host.name, {}, reason), reason
        )

    monkeypatch.setattr(collect, "probe_host", probe_host)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=300)
    outcome = run.run_validate(ValidateRequest(inventories=("inv",), forks=2), console.print)
    assert [p.host for p in outcome.probes] == names
    assert sorted(outcome.fleet.findings) == sorted(names)
    plain = _RICH_SGR.sub("", out.getvalue())
    assert not _CONTROL.findall(plain) and not any(c in plain for c in ATTACKS)
    assert plain.count("[bold red]PASS[/bold red] \\x1b[2K") == 4 + 1  # 4 reasons, 1 warning
    assert "probed  gpu-1 (1.0 s)" in plain
