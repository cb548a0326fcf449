"""The text of a scenario's preconditions and token sources, shared by the terminal table,
report.md/report.html and `kvops explain` (one wording, several renderers).

Plain strings: each renderer escapes them its own way (rich markup, Markdown, HTML).
"""

from __future__ import annotations

from kvops.abtest.explain import explain_scenario
from kvops.abtest.result_types import RunResults, ScenarioResult
from kvops.abtest.validity import ScenarioChecks, TokenSources

_MARK = {"ok": "ok", "failed": "FAILED", "warn": "note", "unknown": "unknown", "n/a": "n/a"}


def verdict_text(sc: ScenarioResult) -> str:
    """ "offload <verdict>" with what is said beside it (e.g. "fits in GPU memory"); a verdict
    that names offload itself ("offload never engaged") is not prefixed twice."""
    note = sc.checks.verdict_note if sc.checks is not None else None
    head = sc.verdict if sc.verdict.startswith("offload") else f"offload {sc.verdict}"
    return head + (f" — {note}" if note else "")


def comparison_verdict(verdict: str, caveat: str | None) -> str:
    return verdict + (f" ({caveat})" if caveat else "")


def precondition_lines(checks: ScenarioChecks | None) -> list[str]:
    if checks is None:
        return []
    return [
        f"[{_MARK.get(p.status, p.status)}] {p.check}: {p.message}" for p in checks.preconditions
    ]


def _n(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _share(src: TokenSources, part: float | None) -> str:
    share = src.share(part)
    return _n(part) + ("" if share is None else f" ({share:.0%})")


SOURCE_HEAD = [
    "arm",
    "prompt tokens looked up",
    "GPU prefix cache",
    "offload tier",
    "computed",
    "stored to offload",
]


def token_source_rows(checks: ScenarioChecks | None) -> list[list[str]]:
    """Per arm: tokens looked up, served from the GPU prefix cache, loaded from the offload
    tier (per tier where the engine splits them), computed, stored - the engines' counters."""
    if checks is None:
        return []
    rows = []
    for arm, src in checks.token_sources.items():
        tiers = {k: v for k, v in src.by_source.items() if k != "device" and v}
        offload = _share(src, src.offload_tokens)
        if len(tiers) > 1:
            offload += " = " + ", ".join(f"{k} {_n(v)}" for k, v in sorted(tiers.items()))
        rows.append(
            [
                arm,
                _n(src.looked_up_tokens),
                _share(src, src.gpu_cache_tokens),
                offload,
                _share(src, src.computed_tokens),
                _n(src.stored_tokens),
            ]
        )
    return rows


def token_source_lines(checks: ScenarioChecks | None) -> list[str]:
    return [
        f"{r[0]}: {r[1]} prompt tokens looked up; GPU prefix cache {r[2]}; offload tier {r[3]}; "
        f"computed {r[4]}; stored to offload {r[5]}"
        for r in token_source_rows(checks)
    ]


def why_lines(doc: RunResults, name: str) -> list[str]:
    """The cause of the scenario's result per candidate arm, from the run alone (no storage
    evidence: `kvops explain RUNDIR --evidence DIR` adds it)."""
    sc = doc.scenarios[name]
    if sc.checks is None:  # a document written before kvops read the engines' counters
        return []
    return [f"why ({e.arm}): {e.line}" for e in explain_scenario(name, sc, doc.arm_names)]
