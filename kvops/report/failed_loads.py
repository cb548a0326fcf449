"""One line per arm whose KV loads failed (`kvops.abtest.failed_loads`), for the terminal
summary, report.md and report.html alike: how many, from which source, per trial, and the first
line the log gave, so a reader sees the verdict includes recomputed loads without opening
results.json. Arms with none found say nothing (results.json keeps their zero and its sources);
a service log that could not be read is said."""

from __future__ import annotations

from kvops.abtest.result_types import ScenarioResult


def failed_load_lines(sc: ScenarioResult) -> list[str]:
    out = []
    for arm, block in sc.arms.items():
        fl = block.failed_loads
        if fl is None:
            continue
        sources = ", ".join(fl.sources)
        if fl.failed_loads <= 0:
            if fl.log_errors:
                out.append(
                    f"failed KV loads, {arm}: unknown, the service log could not be read "
                    f"({fl.log_errors[0]})"
                )
            continue
        trials = ", ".join(
            f"trial {int(t['trial']) + 1}: {t['failed_loads']}" for t in fl.per_trial
        )
        line = (
            f"failed KV loads, {arm}: at least {fl.failed_loads} ({fl.detail()}; {trials}; "
            f"from {sources}): recomputed, so the verdict includes them"
        )
        if fl.examples:
            line += f'; first: "{fl.examples[0]}"'
        out.append(line)
    return out
