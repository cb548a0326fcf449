"""Arms of several instances in the ab-test reports: the cross-instance hit share and each
instance's figures (kvops.abtest.fleet_figures), as terminal lines and as a Markdown table.

Why beside the arm's pooled figures rather than instead of them: the verdict compares arms;
these lines say how each arm's load and hits fell on its instances, and how much of what it
loaded another instance had computed - the figure `kvops sim run --instances N` predicts as
`cross_instance_hit_share`. URLs come from the operator, counters from the servers: every
string goes through host_text before it is rendered.
"""

from __future__ import annotations

from kvops.abtest.result_types import InstanceFigures, ScenarioResult
from kvops.report.host_text import markdown_inline

INSTANCE_HEAD = (
    "arm", "instance", "requests", "errors", "mean TTFT ms", "median TTFT ms",
    "GPU hit tok", "offload hit tok", "cross-instance hit tok", "stored tok",
)  # fmt: skip


def _num(x: float | int | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 or float(x).is_integer() else f"{x:,.1f}"


def share_text(share: float | None) -> str:
    return "n/a (nothing loaded, or not reported)" if share is None else f"{share:.0%}"


def fleet_lines(sc: ScenarioResult, route: str | None) -> list[str]:
    """Plain lines (the caller marks them up): per fleet arm, its share, then one line per
    instance."""
    out: list[str] = []
    for arm, block in sc.arms.items():
        if block.instances is None:
            continue
        how = f", route {route}" if route else ""
        out.append(
            f"{arm}: {len(block.instances)} instances{how}; cross-instance hit share "
            f"{share_text(block.cross_instance_hit_share)} of its offload hits"
        )
        out += [f"  {_instance_line(i)}" for i in block.instances]
    return out


def _instance_line(i: InstanceFigures) -> str:
    return (
        f"{i.url}: {i.requests} requests, {i.errors} errors, mean TTFT "
        f"{_num(i.mean_ttft_ms)} ms; hits: GPU {_num(i.gpu_hit_tokens)} tok, offload "
        f"{_num(i.offload_hit_tokens)} tok (cross-instance {_num(i.cross_instance_hit_tokens)}); "
        f"stored {_num(i.stored_tokens)} tok"
    )


def fleet_markdown(sc: ScenarioResult, route: str | None) -> list[str]:
    """The per-instance table of a scenario's fleet arms ([] when no arm has several)."""
    fleet = {a: b for a, b in sc.arms.items() if b.instances is not None}
    if not fleet:
        return []
    how = f" (route `{markdown_inline(route)}`)" if route else ""
    out = ["", f"Instances of each arm of several endpoints{how}:", ""]
    out += [
        f"- {markdown_inline(a)}: cross-instance hit share "
        f"{share_text(b.cross_instance_hit_share)} of its offload hits"
        for a, b in fleet.items()
    ]
    out += ["", "| " + " | ".join(INSTANCE_HEAD) + " |", "|" + "---|" * len(INSTANCE_HEAD)]
    for arm, block in fleet.items():
        for i in block.instances or []:
            cells = [
                arm, i.url, str(i.requests), str(i.errors), _num(i.mean_ttft_ms),
                _num(i.median_ttft_ms), _num(i.gpu_hit_tokens), _num(i.offload_hit_tokens),
                _num(i.cross_instance_hit_tokens), _num(i.stored_tokens),
            ]  # fmt: skip
            out.append("| " + " | ".join(markdown_inline(c) for c in cells) + " |")
    return out
