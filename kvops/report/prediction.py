"""The prediction's score in the reports: per scenario, predicted against measured deltas.

Why its own section: the prediction was written before the run (prediction.json) from the
profiles named here, so the table says how far the simulator was off for this site, and
whether its verdicts held, the figures `kvops advise --calibrate` improves on.
"""

from __future__ import annotations

import html

from kvops.abtest.score import DEFINITION, PredictionScore

HEAD = ["metric", "predicted Δ", "measured Δ", "error", "predicted verdict", "measured verdict"]


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1f}%"


def rows(score: PredictionScore, scenario: str) -> list[list[str]]:
    sc = score.scenarios.get(scenario)
    if sc is None:
        return []
    return [
        [
            m.metric, _pct(m.predicted_delta_pct), _pct(m.measured_delta_pct),
            "—" if m.error_pp is None else f"{m.error_pp:.1f} pp",
            m.predicted_verdict,
            m.measured_verdict + {True: " (agree)", False: " (differ)", None: ""}[m.verdicts_agree],
        ]
        for m in sc.metrics
    ]  # fmt: skip


def summary_line(score: PredictionScore) -> str:
    return f"Prediction (from {score.source}), written before the run: {score.score.text()}."


def prediction_markdown(score: PredictionScore | None) -> list[str]:
    if score is None:
        return []
    out = [
        "",
        "## Prediction vs measurement",
        "",
        summary_line(score),
        "",
        f"_Score: {DEFINITION}._",
    ]
    for name in score.scenarios:
        out += ["", f"{name}:", "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
        out += ["| " + " | ".join(r) + " |" for r in rows(score, name)]
    return out


def prediction_html(score: PredictionScore | None) -> list[str]:
    if score is None:
        return []
    e = html.escape
    parts = ["<h2>Prediction vs measurement</h2>", f"<p>{e(summary_line(score))}</p>"]
    for name in score.scenarios:
        parts.append(f"<p>{e(name)}:</p><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in HEAD))
        parts += [
            "<tr>" + "".join(f"<td>{e(x)}</td>" for x in r) + "</tr>" for r in rows(score, name)
        ]
        parts.append("</table>")
    return parts
