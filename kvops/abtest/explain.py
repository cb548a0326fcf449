"""Why an A/B scenario came out as it did, in one line per candidate arm, with its figures.

Joined from what kvops already has: the scenario's preconditions and token sources
(`kvops.abtest.validity`, from the engines' own counters) and, when a validate bundle is given
(`kvops validate --storage-bench --save-evidence DIR`), the storage evidence: cuFile compat mode
or LMCache's POSIX fallback (validate GDS-032/040/051/065/066), chunk keys that change across
processes (GDS-062: PYTHONHASHSEED unset and the builtin hash), LMCache's chunk size (only full
chunks are stored: a prefix shorter than one chunk is never offloaded), and gdsio's GPU-direct
read bandwidth against the break-even bandwidth `kvops advise sizing` computes (below it,
loading a prefix takes longer than recomputing it: reference physics in `kvops.sim.costs`).

The first cause that applies wins, in this order: a broken arm; no reuse; a working set that
fits the GPU; offload never engaged (with its likely reason from the evidence); storage slower
than break-even or in compat mode; and otherwise what the counters show. `storage_facts` reads
the bundle's documents (`kvops.advise.storage_evidence.storage_facts`, no I/O);
`explain_scenario` is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvops.abtest.result_types import ScenarioResult
from kvops.abtest.validity import HOST_OVERLOADED, NEVER_ENGAGED, TokenSources, has_reuse


class StorageEvidence(Protocol):
    """What a validate bundle says about the offload path (built by
    `kvops.advise.storage_evidence.storage_facts`; a Protocol so the two parts do not import
    each other)."""

    compat: list[str]  # "host GDS-051: message"
    unstable_hash: list[str]
    chunk_sizes: dict[str, int]  # host -> LMCache chunk_size
    read_gb_s: float | None  # gdsio GPU-direct read, slowest host
    read_host: str | None


@dataclass
class Explanation:
    scenario: str
    arm: str
    cause: str  # broken | host_overloaded | no_reuse | fits | never_engaged | slow_storage | ...
    line: str

    def to_json(self) -> dict[str, str]:
        return dict(self.__dict__)


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:,.0f}"


def _share(src: TokenSources | None, part: float | None) -> str:
    if src is None or src.share(part) is None:
        return "?"
    return f"{src.share(part):.0%}"


def _get(src: TokenSources | None, attr: str) -> float | None:
    return getattr(src, attr) if src is not None else None


def _never_engaged_reason(
    spec_prefix_tokens: int, src: TokenSources | None, facts: StorageEvidence | None
) -> str:
    if facts is not None:
        if facts.unstable_hash:
            return (
                "chunk keys change between processes (" + facts.unstable_hash[0] + "): what one "
                "process stored, the next cannot find"
            )
        small = {h: c for h, c in facts.chunk_sizes.items() if c > spec_prefix_tokens}
        if small:
            host, chunk = next(iter(small.items()))
            return (
                f"LMCache chunk_size {chunk} on {host} exceeds the {spec_prefix_tokens}-token "
                "prefixes: only full chunks are stored, so none was"
            )
        if len(set(facts.chunk_sizes.values())) > 1:
            return f"hosts disagree on LMCache chunk_size ({facts.chunk_sizes}): keys differ"
        if facts.compat:
            return "the GDS path is not GPU-direct (" + facts.compat[0] + ")"
    if src is not None and src.failed_stores:
        return f"LMCache dropped {_n(src.failed_stores)} stores (lmcache:put_failed_count)"
    if src is not None and src.stored_tokens == 0:
        return "its connector stored nothing either: check gds_path and its permissions"
    if src is not None and src.stored_tokens:
        return (
            f"it stored {_n(src.stored_tokens)} tokens but found none again: chunk keys differ "
            "between store and lookup (PYTHONHASHSEED, chunk_size) or the store was cleared"
        )
    return "no evidence bundle given to say why (kvops explain --evidence DIR)"


def explain_scenario(
    name: str,
    sc: ScenarioResult,
    arm_names: Sequence[str],
    facts: StorageEvidence | None = None,
    break_even_gb_s: float | None = None,
) -> list[Explanation]:
    """One cause per candidate arm of one scenario."""
    out: list[Explanation] = []
    spec = sc.workload
    checks = sc.checks
    base = arm_names[0]
    sources = checks.token_sources if checks is not None else {}
    base_src = sources.get(base)
    for cand in arm_names[1:]:
        src = sources.get(cand)
        comp = sc.comparison("total_token_throughput_tok_s", cand)
        delta = comp.delta_pct if comp is not None else None
        change = "?" if delta is None else f"{delta:+.1f}%"
        verdict = sc.verdict if cand == arm_names[1] else (comp.verdict if comp else "?")

        def add(cause: str, text: str, arm: str = cand) -> None:
            out.append(Explanation(name, arm, cause, text))

        if verdict.startswith("invalid"):
            add("broken", f"{verdict}: an arm failed beyond 1% of its requests; nothing to explain")
            continue
        if verdict == HOST_OVERLOADED:
            add(
                "host_overloaded",
                f"{verdict}: the simulated engines ran behind their model's schedule, so "
                f"throughput {change} measured this host's CPU, not offload; rerun on a quieter "
                "host or with a larger --sim-time-scale",
            )
            continue
        if not has_reuse(spec):
            add(
                "no_reuse",
                "no reuse: every prompt is new, so there is nothing to load; "
                f"throughput {change} ({verdict}) measures offload's store overhead only",
            )
            continue
        if checks is not None and checks.verdict_note and checks.working_set_tokens is not None:
            add(
                "fits",
                f"fits in GPU memory: working set {_n(checks.working_set_tokens)} tokens "
                f"<= GPU KV capacity {_n(checks.gpu_kv_capacity_tokens)}; the baseline's GPU "
                f"prefix cache served {_share(base_src, _get(base_src, 'gpu_cache_tokens'))} "
                f"of its prompt tokens, so offload cannot help (throughput {change}, {verdict})",
            )
            continue
        if verdict == NEVER_ENGAGED or (
            checks is not None
            and any(
                p.check == "offload_engaged" and p.arm == cand and p.status == "failed"
                for p in checks.preconditions
            )
        ):
            reason = _never_engaged_reason(spec.prefix_tokens, src, facts)
            add(
                "never_engaged",
                f"{NEVER_ENGAGED}: {cand} loaded 0 of "
                f"{_n(src.looked_up_tokens if src else None)} prompt tokens; {reason}",
            )
            continue
        loaded = f"{cand} loaded {_n(src.offload_tokens if src else None)} prompt tokens " + (
            f"({_share(src, src.offload_tokens if src else None)}) from the offload tier"
        )
        helps = verdict == "helps"
        slow = (
            facts is not None
            and facts.read_gb_s is not None
            and break_even_gb_s is not None
            and facts.read_gb_s < break_even_gb_s
        )
        if slow and not helps and facts is not None and break_even_gb_s is not None:
            add(
                "slow_storage",
                f"storage slower than break-even: gdsio read "
                f"{facts.read_gb_s:.2f} GB/s on {facts.read_host} < break-even "
                f"{break_even_gb_s:.2f} GB/s for {spec.prefix_tokens}-token prefixes, so "
                f"loading a prefix takes longer than recomputing it; {loaded}; "
                f"throughput {change}",
            )
            continue
        if facts is not None and facts.compat and not helps:
            add(
                "compat",
                f"the GDS path is not GPU-direct ({facts.compat[0]}); {loaded}; "
                f"throughput {change}",
            )
            continue
        computed = (
            f"computed share {_share(base_src, base_src.computed_tokens if base_src else None)} "
            f"-> {_share(src, src.computed_tokens if src else None)}"
        )
        if src is not None and src.failed_stores:
            loaded += f"; LMCache dropped {_n(src.failed_stores)} stores (put_failed_count)"
        if helps:
            add("helps", f"offload helps: {loaded}; {computed}; throughput {change}")
        elif facts is None:
            add(
                "unexplained",
                f"offload {verdict}: {loaded}; {computed}; throughput {change}; "
                "give a validate bundle (--evidence DIR) to compare the storage with break-even",
            )
        else:
            above = (
                f"gdsio read {facts.read_gb_s:.2f} GB/s >= break-even {break_even_gb_s:.2f} GB/s"
                if facts.read_gb_s is not None and break_even_gb_s is not None
                else "no gdsio read figure to compare with break-even"
            )
            add(
                "unexplained",
                f"offload {verdict}: {loaded}; {computed}; {above}; throughput {change}",
            )
    if checks is not None:
        for p in checks.preconditions:
            if p.check == "kv_capacity" and p.status == "warn":
                for e in out:
                    if e.arm == p.arm:
                        e.line += f"; {p.message}"
    return out
