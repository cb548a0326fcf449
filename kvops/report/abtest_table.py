"""The ab-test terminal summary (rich): one table for all scenarios, then warnings.

Why one table: `--scenario all` exists to show the three outcomes side by side; the operator
reads the verdict column first and the confidence intervals second.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

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


def render_table(doc: dict[str, Any], console: Console) -> None:
    arm_names = [a["name"] for a in doc["arms"]] or _arms_from(doc)
    base = arm_names[0] if arm_names else "baseline"
    table = Table(title="kvops ab-test", title_style="bold", show_lines=False)
    table.add_column("scenario")
    table.add_column("metric")
    for a in arm_names:
        table.add_column(a, justify="right")
    table.add_column("Δ vs " + base, justify="right")
    table.add_column("95% CI", justify="right")
    table.add_column("verdict")
    for name, sc in doc["scenarios"].items():
        first = True
        comps = {(c["metric"], c["candidate_arm"]): c for c in sc["comparisons"]}
        cand = arm_names[1] if len(arm_names) > 1 else None
        for metric, label in TABLE_METRICS:
            c = comps.get((metric, cand)) if cand else None
            verdict = c["verdict"] if c else ""
            table.add_row(
                f"[bold]{name}[/]" if first else "",
                label,
                *[fmt_num(sc["arms"].get(a, {}).get("metrics", {}).get(metric)) for a in arm_names],
                fmt_pct(c["delta_pct"]) if c else "",
                f"[{fmt_pct(c['ci95_low_pct'])}, {fmt_pct(c['ci95_high_pct'])}]" if c else "",
                f"[{_STYLE.get(verdict, 'dim')}]{verdict}[/]",
            )
            first = False
        table.add_section()
    console.print(table)
    for name, sc in doc["scenarios"].items():
        arms = [a for a in arm_names if a in sc["arms"]]
        errs = ", ".join(f"{a} {sc['arms'][a]['errors_total']}" for a in arms)
        share = ", ".join(
            f"{a} {_share(sc['arms'][a]['metrics'].get('cached_token_share'))}" for a in arms
        )
        style = _STYLE.get(sc["verdict"], "bold")
        console.print(
            f"{name}: offload [{style}]{sc['verdict']}[/]  [dim](errors: {errs}; "
            f"cached-token share: {share}; {protocol_line(doc, sc)})[/]"
        )
    _prediction_lines(doc, arm_names, console)
    client = doc.get("client", {})
    if client:
        line = (
            f"client: dispatch lag mean {client['dispatch_lag_mean_ms']:.2f} ms, loop lag p99 "
            f"{client['loop_lag_p99_ms']:.2f} ms, max in flight {client['max_in_flight']}"
        )
        if client.get("bottleneck"):
            console.print(f"[bold yellow]{line} — the client was the bottleneck: "
                          f"{client['bottleneck_reason']}[/]")  # fmt: skip
        else:
            console.print(f"[dim]{line} — not a bottleneck[/]")
    for w in doc.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {w}")
    if doc.get("status") != "complete":
        console.print(f"[bold yellow]run {doc.get('status')}: figures cover what completed[/]")
    if doc.get("status_detail"):
        console.print(f"[bold red]{doc['status_detail']}: its verdicts are void[/]")


def _prediction_lines(doc: dict[str, Any], arm_names: list[str], console: Console) -> None:
    """The model's own virtual-time figures beside the measured ones (embedded engines): if
    they disagree, the host shaped the measurement (see the warnings)."""
    prediction = doc.get("model_prediction") or {}
    if len(arm_names) < 2:
        return
    base, cand = arm_names[0], arm_names[1]
    for name, arms in prediction.items():
        if base not in arms or cand not in arms:
            continue
        parts = []
        for metric, label in TABLE_METRICS:
            b, c = arms[base].get(metric), arms[cand].get(metric)
            if b and c is not None:
                parts.append(f"{label} {fmt_num(b)} → {fmt_num(c)} ({fmt_pct(100 * (c / b - 1))})")
        if parts:
            console.print(f"[dim]{name}: the model predicts {base} → {cand}: {'; '.join(parts)}[/]")


def protocol_line(doc: dict[str, Any], sc: dict[str, Any]) -> str:
    """How the requests were sent, which changes what a cache can reuse: order, run seed."""
    order = sc["workload"].get("request_order", "cyclic")
    seed = (doc.get("options") or {}).get("seed")
    return f"requests {order}" + (f", run seed {seed}" if seed is not None else "")


def _share(x: Any) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _arms_from(doc: dict[str, Any]) -> list[str]:
    for sc in doc["scenarios"].values():
        return list(sc["arms"])
    return []
