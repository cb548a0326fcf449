"""Render validate findings: rich table per host with a fleet summary, JSON, JUnit XML.

JUnit has one testcase per host x check id (classname = host), so CI shows which check broke
on which host: FAIL → <failure>, SKIP → <skipped>, WARN → passes with the message in
<system-out> (a warning must not break a pipeline, but must stay visible).

Every string here may come from a host (its name, the messages and excerpts quoting its
evidence), so it goes through `kvops.report.host_text` first: shown as text in rich (never
parsed as markup), its control characters escaped in every format.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvops.checks import Finding, Severity
from kvops.checks.fleet import FleetResult, worst
from kvops.report.host_text import markup, printable

STYLE = {
    Severity.PASS: "green",
    Severity.WARN: "yellow",
    Severity.FAIL: "bold red",
    Severity.SKIP: "dim",
}


def host_table(
    host: str, findings: list[Finding], verbose: bool = False, problems_only: bool = False
) -> Table:
    """One row per finding; evidence excerpts only with `verbose` (they are long);
    `problems_only` keeps FAIL/WARN rows so a large fleet's output stays readable."""
    status = worst(f.severity for f in findings)
    table = Table(
        title=Text.assemble(f"{printable(host, one_line=True)}  ", (str(status), STYLE[status])),
        title_justify="left",
        show_lines=verbose,
    )
    table.add_column("id", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("check")
    table.add_column("finding", overflow="fold")  # fold long metric names, never crop them
    table.add_column("remedy", overflow="fold")
    for item in findings:
        if problems_only and item.severity not in (Severity.FAIL, Severity.WARN):
            continue
        message = item.message + (f"\n{item.evidence}" if verbose and item.evidence else "")
        table.add_row(
            markup(item.check_id),
            Text(str(item.severity), style=STYLE[item.severity]),
            markup(item.title, one_line=False),
            markup(message, one_line=False),
            markup(item.remedy, one_line=False),
        )
    return table


def summary_table(result: FleetResult) -> Table:
    table = Table(title="fleet", title_justify="left")
    for column in ("host", "status", "FAIL", "WARN", "PASS", "SKIP"):
        table.add_column(column)
    for host, findings in result.findings.items():
        status = result.host_status(host)
        counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
        table.add_row(
            markup(host),
            Text(str(status), style=STYLE[status]),
            *(str(counts[s]) for s in (Severity.FAIL, Severity.WARN, Severity.PASS, Severity.SKIP)),
        )
    return table


def render_terminal(
    result: FleetResult, console: Console, verbose: bool = False, problems_only: bool = False
) -> None:
    for host, findings in result.findings.items():
        console.print(host_table(host, findings, verbose, problems_only))
    console.print(summary_table(result))
    counts = result.counts()
    console.print(
        f"{len(result.findings)} hosts: {counts['PASS']} pass, {counts['WARN']} warn, "
        f"{counts['FAIL']} fail"
        + (f", {len(result.unreachable)} not probed" if result.unreachable else "")
    )


def to_json(result: FleetResult) -> str:
    return json.dumps(result.to_dict(), indent=2, sort_keys=True)


def _merge(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """Group by check id: some checks emit one finding per item (e.g. each unknown key)."""
    grouped: dict[str, list[Finding]] = {}
    for item in findings:
        grouped.setdefault(item.check_id, []).append(item)
    return grouped


def to_junit(result: FleetResult, suite_name: str = "kvops-validate") -> str:
    suites = ET.Element("testsuites", name=suite_name)
    for raw_host, findings in result.findings.items():
        host = printable(raw_host, one_line=True)
        grouped = _merge(findings)
        suite = ET.SubElement(suites, "testsuite", name=host, tests=str(len(grouped)))
        failures = skipped = 0
        for check_id, items in grouped.items():
            severity = worst(f.severity for f in items)
            case = ET.SubElement(
                suite, "testcase", classname=host, name=printable(f"{check_id} {items[0].title}")
            )
            text = printable(
                "\n".join(
                    f"[{f.severity}] {f.message}" + (f"\n{f.evidence}" if f.evidence else "")
                    for f in items
                )
            )
            remedies = printable("; ".join(sorted({f.remedy for f in items if f.remedy})))
            if severity is Severity.FAIL:
                failures += 1
                failed = [f for f in items if f.severity is Severity.FAIL]
                node = ET.SubElement(case, "failure", message=printable(failed[0].message))
                node.text = text + (f"\nremedy: {remedies}" if remedies else "")
            elif severity is Severity.SKIP:
                skipped += 1
                ET.SubElement(case, "skipped", message=printable(items[0].message))
            else:
                ET.SubElement(case, "system-out").text = text
        suite.set("failures", str(failures))
        suite.set("skipped", str(skipped))
        suite.set("errors", "0")
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: Path, result: FleetResult, suite_name: str = "kvops-validate") -> None:
    """`--junit FILE` of validate and smoke: the parent directory is created if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_junit(result, suite_name), encoding="utf-8")
