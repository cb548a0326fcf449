"""results.json, report.md and report.html for an ab-test run.

The Markdown and HTML carry the same content (HTML is for sharing with people who will not open
a .md): verdicts, every compared metric with its 95% CI, the arms' self-descriptions, with
--deploy what each arm's deploys put on the host, the warnings and the client's health, with the
plots beside them.

The servers wrote part of it (each arm's version, models and cache configuration, the warnings
quoting them): that text goes through `host_text.printable` as one line, so a control
character or a newline cannot forge a line of the report, and through `html.escape` in HTML.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

from kvops.abtest.result_types import RunResults, ScenarioResult
from kvops.report.abtest_deploy import deploy_html, deploy_markdown
from kvops.report.abtest_fleet import fleet_lines, fleet_markdown
from kvops.report.abtest_plots import write_plots
from kvops.report.abtest_table import fmt_num, fmt_pct, protocol_line
from kvops.report.explain import (
    SOURCE_HEAD,
    comparison_verdict,
    precondition_lines,
    token_source_lines,
    token_source_rows,
    verdict_text,
    why_lines,
)
from kvops.report.failed_loads import failed_load_lines
from kvops.report.host_text import markdown_inline, printable
from kvops.report.prediction import prediction_html, prediction_markdown
from kvops.workload.record import RequestRecord


def write_reports(
    run_dir: Path, doc: RunResults, measured: dict[str, dict[str, list[RequestRecord]]]
) -> list[Path]:
    (run_dir / "results.json").write_text(doc.to_text())
    plots, note = write_plots(run_dir / "plots", doc, measured)
    md = markdown(doc, [p.relative_to(run_dir) for p in plots], note)
    (run_dir / "report.md").write_text(md)
    (run_dir / "report.html").write_text(
        to_html(doc, [p.relative_to(run_dir) for p in plots], note)
    )
    return [run_dir / "results.json", run_dir / "report.md", run_dir / "report.html", *plots]


def _rows(doc: RunResults, name: str) -> list[list[str]]:
    rows = []
    for c in doc.scenarios[name].comparisons:
        rows.append(
            [
                c.metric, f"{c.baseline_arm} {fmt_num(c.baseline)}",
                f"{c.candidate_arm} {fmt_num(c.candidate)}", fmt_pct(c.delta_pct),
                f"[{fmt_pct(c.ci95_low_pct)}, {fmt_pct(c.ci95_high_pct)}]",
                comparison_verdict(c.verdict, c.caveat), c.resample_unit,
            ]
        )  # fmt: skip
    return rows


_HEAD = ["metric", "baseline", "candidate", "Δ", "95% CI", "verdict", "resampled"]


def _arm_lines(doc: RunResults) -> list[str]:
    """One line per arm, as the arm's server described itself (so: `printable`, one line)."""
    return [
        printable(
            f"{a.name}: {a.url} — version {a.version}, model "
            f"{(a.models or ['?'])[0]}, max_model_len {a.max_model_len}"
            + kv_memory_note(a.cache_config or {}),
            one_line=True,
        )
        for a in doc.arms
    ]


def kv_memory_note(cache: Mapping[str, str]) -> str:
    """The arm's KV-cache configuration as the server reports it (vLLM's cache_config_info;
    the LMCache fields only from kvops sim): GPU blocks, the KV memory when it is fixed
    (`--kv-cache-memory-bytes`), the GDS staging buffer they lost, the CPU tier in front of
    GDS."""
    out = ""
    if cache.get("num_gpu_blocks"):
        out += f", {cache['num_gpu_blocks']} GPU KV blocks of {cache.get('block_size', '?')} tokens"
    kv_bytes = cache.get("kv_cache_memory_bytes", "")
    if kv_bytes.isdigit() and int(kv_bytes) > 0:
        out += f" (KV memory fixed at {int(kv_bytes) / 1024**3:.2f} GiB per GPU)"
    buffer_mib = cache.get("lmcache_gds_buffer_mib")
    if buffer_mib not in (None, "", "0"):
        out += f" (LMCache GDS buffer {buffer_mib} MiB taken from the KV cache)"
    cpu_gb = cache.get("lmcache_local_cpu_gb")
    if cpu_gb not in (None, "", "0", "0.0"):
        out += f", LMCache CPU tier {cpu_gb} GB in front of GDS"
    return out


def markdown(doc: RunResults, plots: list[Path], note: str | None) -> str:
    status = (
        f"Status: **{doc.status}**; run directory `{doc.run_dir}`; "
        f"schema version {doc.schema_version}."
        + (f" {doc.status_detail}." if doc.status_detail else "")
    )
    out = ["# kvops ab-test report", "", status, "", "## Arms", ""]
    out += [f"- {markdown_inline(line)}" for line in _arm_lines(doc)]
    if doc.deploy:
        out += ["", *deploy_markdown(doc.deploy)]
    if doc.warnings:
        out += ["", "## Warnings", ""] + [f"- {markdown_inline(w)}" for w in doc.warnings]
    for name, sc in doc.scenarios.items():
        out += [
            "",
            f"## {name}: {markdown_inline(verdict_text(sc))}",
            "",
            f"({protocol_line(doc, sc)})",
            "",
        ]
        out += ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
        out += ["| " + " | ".join(r) + " |" for r in _rows(doc, name)]
        out += [""] + [
            f"- {arm}: {b.metrics.completed} completed, {b.errors_total} errors, "
            f"{b.warmup_requests} warm-up requests, cached-token share "
            f"{fmt_num(b.metrics.cached_token_share)}"
            for arm, b in sc.arms.items()
        ]
        out += _checks_markdown(sc)
        route = doc.options.get("route")
        out += fleet_markdown(sc, str(route) if route is not None else None)
        failed = failed_load_lines(sc)
        out += [""] + [f"- **{markdown_inline(line)}**" for line in failed] if failed else []
        why = why_lines(doc, name)
        out += [""] + [f"- **{markdown_inline(w)}**" for w in why] if why else []
        out += [""] + [
            f"![{p.stem}]({p.as_posix()})" for p in plots if p.stem.startswith(name + "-")
        ]
    out += prediction_markdown(doc.prediction_score)
    c = doc.client
    out += ["", "## Client", "", f"Dispatch lag mean {c.dispatch_lag_mean_ms:.2f} ms (p99 "
            f"{c.dispatch_lag_p99_ms:.2f}), event-loop lag p99 {c.loop_lag_p99_ms:.2f} ms, "
            f"max in flight {c.max_in_flight}: "
            + ("**the client was the bottleneck** (" + str(c.bottleneck_reason) + ")"
               if c.bottleneck else "not a bottleneck") + "."]  # fmt: skip
    if note:
        out += ["", f"_{note}_"]
    return "\n".join(out) + "\n"


def _checks_markdown(sc: ScenarioResult) -> list[str]:
    out: list[str] = []
    lines = precondition_lines(sc.checks)
    if lines:
        out += ["", "Preconditions of the verdict:", ""]
        out += [f"- {markdown_inline(line)}" for line in lines]
    rows = token_source_rows(sc.checks)
    if rows:
        out += [
            "",
            "Where the prompt tokens came from (the engines' counters, measured iterations):",
            "",
        ]
        out += ["| " + " | ".join(SOURCE_HEAD) + " |", "|" + "---|" * len(SOURCE_HEAD)]
        out += ["| " + " | ".join(markdown_inline(x) for x in r) + " |" for r in rows]
    return out


def to_html(doc: RunResults, plots: list[Path], note: str | None) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kvops ab-test</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
        ".helps{color:#080;font-weight:bold}.hurts{color:#b00;font-weight:bold}</style></head><body>",
        f"<h1>kvops ab-test report</h1><p>Status: <b>{e(doc.status)}</b>; run directory "
        f"<code>{e(doc.run_dir)}</code> {e(doc.status_detail or '')}</p>",
        "<h2>Arms</h2><ul>",
        *[f"<li>{e(line)}</li>" for line in _arm_lines(doc)],
        "</ul>",
    ]
    if doc.deploy:
        parts += deploy_html(doc.deploy)
    if doc.warnings:
        warnings = [f"<li>{e(printable(w))}</li>" for w in doc.warnings]
        parts += ["<h2>Warnings</h2><ul>", *warnings, "</ul>"]
    for name, sc in doc.scenarios.items():
        v = e(sc.verdict)
        text = verdict_text(sc)
        lead = "" if sc.verdict.startswith("offload") else "offload "
        inner = e(text[len(lead) :])
        parts.append(f"<h2>{e(name)}: {lead}<span class='{v}'>{inner}</span></h2>")
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in _HEAD) + "</tr>")
        for r in _rows(doc, name):
            cells = [f"<td>{e(x)}</td>" for x in r[:5]] + [
                f"<td class='{e(r[5].split(' (')[0])}'>{e(r[5])}</td>",
                f"<td>{e(r[6])}</td>",
            ]
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
        route = doc.options.get("route")
        checks = (
            precondition_lines(sc.checks)
            + token_source_lines(sc.checks)
            + fleet_lines(sc, str(route) if route is not None else None)
            + why_lines(doc, name)
            + failed_load_lines(sc)
        )
        if checks:
            parts += ["<ul>", *[f"<li>{e(printable(x))}</li>" for x in checks], "</ul>"]
        parts += [
            f"<img src='{e(p.as_posix())}' alt='{e(p.stem)}'>"
            for p in plots
            if p.stem.startswith(name + "-")
        ]
    parts += prediction_html(doc.prediction_score)
    c = doc.client
    parts.append(
        f"<h2>Client</h2><p>Dispatch lag mean {c.dispatch_lag_mean_ms:.2f} ms, event-loop lag "
        f"p99 {c.loop_lag_p99_ms:.2f} ms, max in flight {c.max_in_flight}: "
        + (
            "<b>the client was the bottleneck</b> (" + e(str(c.bottleneck_reason)) + ")"
            if c.bottleneck
            else "not a bottleneck"
        )
        + "</p>"
    )
    if note:
        parts.append(f"<p><i>{e(note)}</i></p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
