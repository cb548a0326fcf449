"""The ab-test terminal summary (rich): one table for all scenarios, then warnings.

Why one table: `--scenario all` exists to show the three outcomes side by side; the operator
reads the verdict column first and the confidence intervals second.

The servers wrote part of what is shown (the warnings quote their versions, models and cache
configuration), so every name and message goes into rich markup through `host_text.markup`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvops.abtest.result_types import Prediction, RunResults, ScenarioResult
from kvops.report.abtest_fleet import fleet_lines
from kvops.report.explain import (
    comparison_verdict,
    precondition_lines,
    token_source_lines,
    verdict_text,
    why_lines,
)
from kvops.report.failed_loads import failed_load_lines
from kvops.report.host_text import markup

TABLE_METRICS = (
    ("total_token_throughput_tok_s", "total tok/s"),
    ("mean_ttft_ms", "mean TTFT ms"),
    ("p99_ttft_ms", "p99 TTFT ms"),
    ("mean_itl_ms", "mean ITL ms"),
)
_STYLE = {"helps": "bold green", "hurts": "bold red"}


def fmt_num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"
    return f"{x:,}"


def fmt_pct(x: Any) -> str:
    return "—" if x is None else f"{x:+.1f}%"


def render_table(doc: RunResults, console: Console) -> None:
    arm_names = doc.arm_names
    base = arm_names[0] if arm_names else "baseline"
    table = Table(title="kvops ab-test", title_style="bold", show_lines=False)
    table.add_column("scenario")
    table.add_column("metric")
    for a in arm_names:
        table.add_column(markup(a), justify="right")
    table.add_column("Δ vs " + markup(base), justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("verdict")
    for name, sc in doc.scenarios.items():
        first = True
        cand = arm_names[1] if len(arm_names) > 1 else None
        for metric, label in TABLE_METRICS:
            c = sc.comparison(metric, cand) if cand else None
            verdict = c.verdict if c else ""
            table.add_row(
                f"[bold]{markup(name)}[/]" if first else "",
                label,
                *[
                    fmt_num(sc.arms[a].metrics.value(metric) if a in sc.arms else None)
                    for a in arm_names
                ],
                fmt_pct(c.delta_pct) if c else "",
                f"[{fmt_pct(c.ci95_low_pct)}, {fmt_pct(c.ci95_high_pct)}]" if c else "",
                f"[{_STYLE.get(verdict, 'dim')}]"
                f"{markup(comparison_verdict(verdict, c.caveat if c else None))}[/]",
            )
            first = False
        table.add_section()
    console.print(table)
    for name, sc in doc.scenarios.items():
        arms = [a for a in arm_names if a in sc.arms]
        errs = ", ".join(f"{a} {sc.arms[a].errors_total}" for a in arms)
        share = ", ".join(f"{a} {_share(sc.arms[a].metrics.cached_token_share)}" for a in arms)
        style = _STYLE.get(sc.verdict, "bold")
        detail = markup(f"errors: {errs}; cached-token share: {share}; {protocol_line(doc, sc)}")
        console.print(f"{markup(name)}: [{style}]{markup(verdict_text(sc))}[/]  [dim]({detail})[/]")
        for line in precondition_lines(sc.checks) + token_source_lines(sc.checks):
            console.print(f"  [dim]{markup(line)}[/]")
        for line in fleet_lines(sc, _route(doc)):
            console.print(f"  {markup(line)}")
        for line in failed_load_lines(sc):
            console.print(f"  [yellow]{markup(line)}[/]")
        for line in why_lines(doc, name):
            console.print(f"  {markup(line)}")
    _prediction_lines(doc.model_prediction or {}, arm_names, console)
    client = doc.client
    line = (
        f"client: dispatch lag mean {client.dispatch_lag_mean_ms:.2f} ms, loop lag p99 "
        f"{client.loop_lag_p99_ms:.2f} ms, max in flight {client.max_in_flight}"
    )
    if client.bottleneck:
        console.print(f"[bold yellow]{line} — the client was the bottleneck: "
                      f"{markup(client.bottleneck_reason)}[/]")  # fmt: skip
    else:
        console.print(f"[dim]{line} — not a bottleneck[/]")
    for w in doc.warnings:
        console.print(f"[bold yellow]warning:[/] {markup(w)}")
    if doc.status != "complete":
        console.print(f"[bold yellow]run {markup(doc.status)}: figures cover what completed[/]")
    if doc.status_detail:
        console.print(f"[bold red]{markup(doc.status_detail)}: its verdicts are void[/]")


# The model predicts only these figures (kvops.abtest.result_types.PredictedFigures).
_PREDICTED = ("total_token_throughput_tok_s", "mean_ttft_ms", "mean_itl_ms")


def _prediction_lines(prediction: Prediction, arm_names: list[str], console: Console) -> None:
    """The model's own virtual-time figures beside the measured ones (embedded engines): if
    they disagree, the host shaped the measurement (see the warnings)."""
    if len(arm_names) < 2:
        return
    base, cand = arm_names[0], arm_names[1]
    for name, arms in prediction.items():
        if base not in arms or cand not in arms:
            continue
        parts = []
        for metric, label in TABLE_METRICS:
            if metric not in _PREDICTED:
                continue
            b, c = arms[base].value(metric), arms[cand].value(metric)
            if b and c is not None:
                parts.append(f"{label} {fmt_num(b)} → {fmt_num(c)} ({fmt_pct(100 * (c / b - 1))})")
        if parts:
            said = markup(f"{name}: the model predicts {base} → {cand}: {'; '.join(parts)}")
            console.print(f"[dim]{said}[/]")


def protocol_line(doc: RunResults, sc: ScenarioResult) -> str:
    """How the requests were sent, which changes what a cache can reuse: order, run seed."""
    seed = doc.run_seed
    if sc.workload.trace is not None:  # --trace: its own order, arrivals and sessions
        order = f"trace replayed as recorded ({sc.workload.description})"
    else:
        order = f"requests {sc.workload.request_order}"
    return order + (f", run seed {seed}" if seed is not None else "")


def _route(doc: RunResults) -> str | None:
    """The run's --route, for arms of several instances (older runs did not record one)."""
    route = doc.options.get("route")
    return str(route) if route is not None else None


def _share(x: Any) -> str:
    return "n/a" if x is None else f"{x:.0%}"
