"""Whether a scenario's A/B verdict can be about offload at all: preconditions checked per
scenario and arm before a verdict is printed, and where each arm's prompt tokens came from.

Why: "offload shows no gain" is the most common report against KV offload (LMCache issues
#2334, #1326, #970, #485 - the last one: vLLM's own GPU cache already held the working set).
A paired verdict is only about offload when the offload arm really loaded KV, when the workload
reuses more KV than the GPU holds, and when the arms differ in nothing else. Each check reads
what the engines said about themselves (`vllm:cache_config_info`) and counted
(`kvops.abtest.engine_counters`), and the workload's shape:

- reuse: a prefix sent more than once within a segment (segments start with a reset cache).
  Without reuse there is nothing to load: the verdict stands and measures offload's store
  overhead only (the unique one-shot case: "no significant difference" or "hurts" is then the
  true answer, so it is not replaced).
- working set (b): distinct prefix tokens plus the KV of the requests in flight against the
  baseline's GPU KV capacity (`num_gpu_blocks` x `block_size`); when it fits, "fits in GPU
  memory: offload cannot help here" is said beside the verdict (the verdict stands: it is what
  offload costs there).
- offload engaged (a): an arm that shows a KV connector (cache_config_info's `kv_connector`,
  LMCache's own metrics, or external prefix-cache queries counted) and loaded nothing
  (`vllm:external_prefix_cache_hits`, else `lmcache:num_hit_tokens`; without either, a
  cached-token share no higher than the baseline's) on a workload with reuse that does not fit
  the GPU: its verdict is "offload never engaged", not a measured difference. The check applies
  to arms that declare a connector only, so an A/A run (a server against itself, no connector)
  keeps its "no significant difference": no arm there claims to offload. An arm that shows no
  connector at all gets a note, since a connector that failed to load also shows none.
- gain attribution: an arm that declares a connector and, by its counters, loaded nothing
  cannot owe a gain to offload (serving KV from the store instead of computing it is the only
  way offload helps), whatever the workload: its "helps" verdicts, per metric and for the
  scenario, become "no gain from offload: nothing loaded", with the measured difference kept
  beside them. Seen: +10% throughput [+3..+18%] from two trials on embedded engines whose
  prefixes fit in GPU memory, the offload arm having loaded 0 tokens; a "hurts" stands (storing
  costs without loading).
- baseline cache (c): the baseline's cached-token share; 0% on a workload with reuse means the
  request order or the cache size decided the result, not the storage.
- KV capacity (d): arms whose GPU KV capacity differs by more than 1% batch differently; the
  difference is named beside every latency verdict as its likely cause.
- host kept up (simulated engines only, which report their emission lag): an arm whose tokens
  left more than OVERLOAD_LAG_SHARE of its mean TTFT late measured the host's CPU, not its
  model; every claim of that scenario reads HOST_OVERLOADED, the measured interval kept beside
  it (`make demo` on a host busy with other work: rerun on a quieter one).

Pure: inputs are the spec, the arms' self-descriptions, their summed counters, cached-token
shares and emission lags.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvops.abtest.engine_counters import SOURCE_PREFIX
from kvops.abtest.score import CLAIMS
from kvops.workload.spec import WorkloadSpec

NEVER_ENGAGED = "offload never engaged"
NOT_FROM_OFFLOAD = "no gain from offload: nothing loaded"
HOST_OVERLOADED = "withheld: the host could not keep up"
# A simulated engine reports how late its tokens left against its model's schedule (emission
# lag). Beyond this share of the arm's mean TTFT the host's CPU, not the engines, set the
# latencies: seen, an A/A (one server in both arms) read total throughput "hurts" -47%
# [-70%, -6%] with both arms 45-53% late; on a quiet 2-core host the lag is 0.2-3%.
OVERLOAD_LAG_SHARE = 0.25
# the verdicts that claim something about the arms (and the gain attribution's rewrite of
# "helps"): an overloaded host voids each of them
_TIMED_CLAIMS = (*CLAIMS, NOT_FROM_OFFLOAD)
FITS_NOTE = "fits in GPU memory: offload cannot help here"
NO_REUSE_NOTE = (
    "no reuse: every prompt is new, so offload has nothing to load (store overhead only)"
)
# metrics whose verdicts a KV-capacity difference explains (batch sizes change every latency,
# and throughput with them)
CAPACITY_SENSITIVE = (
    "total_token_throughput_tok_s",
    "output_throughput_tok_s",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
)
CAPACITY_TOLERANCE = 0.01
# A candidate's cached-token share must exceed the baseline's by this much to count as loads
# when the engine exposes no load counter.
SHARE_MARGIN = 0.01

Json = dict[str, Any]


@dataclass
class TokenSources:
    """One arm's prompt tokens over a scenario's measured iterations, by where their KV came
    from (the engine's counters; None: the engine does not report it)."""

    looked_up_tokens: float | None  # vllm:prefix_cache_queries (else vllm:prompt_tokens)
    gpu_cache_tokens: float | None  # vllm:prefix_cache_hits
    offload_tokens: float | None  # vllm:external_prefix_cache_hits (else lmcache:num_hit_tokens)
    computed_tokens: float | None  # the rest: prefilled on the GPU
    stored_tokens: float | None  # lmcache:num_stored_tokens
    by_source: dict[str, float] = field(default_factory=dict)  # cached tokens per source
    failed_stores: float | None = None  # lmcache:put_failed_count (stores dropped)

    @classmethod
    def of(cls, counters: Mapping[str, float]) -> TokenSources:
        looked = counters.get("gpu_query_tokens", counters.get("prompt_tokens"))
        gpu = counters.get("gpu_hit_tokens")
        off = counters.get("external_hit_tokens", counters.get("lmcache_hit_tokens"))
        computed = None
        if looked is not None and gpu is not None:
            computed = max(0.0, looked - gpu - (off or 0.0))
        by_source = {
            k[len(SOURCE_PREFIX) :]: v for k, v in counters.items() if k.startswith(SOURCE_PREFIX)
        }
        return cls(
            looked, gpu, off, computed, counters.get("lmcache_stored_tokens"), by_source,
            counters.get("lmcache_put_failed"),
        )  # fmt: skip

    def share(self, part: float | None) -> float | None:
        if part is None or not self.looked_up_tokens:
            return None
        return part / self.looked_up_tokens

    def to_json(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: Json) -> TokenSources:
        return cls(**d)


@dataclass
class Precondition:
    check: str  # reuse | working_set | offload_engaged | baseline_cache | kv_capacity
    arm: str
    status: str  # ok | failed | warn | unknown | n/a
    message: str

    def to_json(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: Json) -> Precondition:
        return cls(**d)


@dataclass
class ScenarioChecks:
    preconditions: list[Precondition]
    token_sources: dict[str, TokenSources]
    verdict: str | None  # replaces the scenario's verdict (offload never engaged), or None
    verdict_note: str | None  # said beside the verdict (fits in GPU memory, no reuse)
    caveats: dict[str, dict[str, str]]  # candidate arm -> metric -> caveat beside its verdict
    working_set_tokens: int | None = None
    gpu_kv_capacity_tokens: int | None = None
    # candidate arms that declare a connector and loaded no KV through it (gain attribution)
    nothing_loaded: list[str] = field(default_factory=list)

    def to_json(self) -> Json:
        return {
            "preconditions": [p.to_json() for p in self.preconditions],
            "token_sources": {a: t.to_json() for a, t in self.token_sources.items()},
            "verdict": self.verdict,
            "verdict_note": self.verdict_note,
            "caveats": self.caveats,
            "working_set_tokens": self.working_set_tokens,
            "gpu_kv_capacity_tokens": self.gpu_kv_capacity_tokens,
            "nothing_loaded": self.nothing_loaded,
        }

    @classmethod
    def from_json(cls, d: Json) -> ScenarioChecks:
        return cls(
            [Precondition.from_json(p) for p in d["preconditions"]],
            {a: TokenSources.from_json(t) for a, t in d["token_sources"].items()},
            d["verdict"],
            d["verdict_note"],
            {a: dict(m) for a, m in d["caveats"].items()},
            d.get("working_set_tokens"),
            d.get("gpu_kv_capacity_tokens"),
            _arm_names(d.get("nothing_loaded")),
        )


def _arm_names(value: object) -> list[str]:
    """A document's list of arm names; anything else (an older document has none) is none."""
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


def distinct_prefixes(spec: WorkloadSpec) -> int:
    """Prefixes a segment uses: request j of an iteration takes prefix j mod num_prefixes."""
    return min(spec.num_prefixes, spec.per_iteration) if spec.num_prefixes else 0


def has_reuse(spec: WorkloadSpec) -> bool:
    """Some prefix is sent more than once in a segment (the unit a reset cache starts); a
    replayed trace is taken to reuse (`kvops advise TRACE` measures how much)."""
    if spec.trace is not None:
        return True
    return distinct_prefixes(spec) > 0 and spec.total_requests > distinct_prefixes(spec)


def in_flight(spec: WorkloadSpec) -> int:
    """Requests the engine holds at once at most: the batch, or the concurrency cap."""
    if spec.rate is None:
        return min(spec.batch_size, spec.per_iteration)
    return min(spec.max_concurrency or spec.per_iteration, spec.per_iteration)


def working_set_tokens(spec: WorkloadSpec) -> int:
    """KV tokens reuse needs resident: the distinct prefixes, plus each in-flight request's own
    suffix and output."""
    prefixes = distinct_prefixes(spec) * spec.prefix_tokens
    return prefixes + in_flight(spec) * (spec.suffix_tokens + spec.output_tokens)


def kv_capacity_tokens(cache_config: Mapping[str, str] | None) -> int | None:
    """num_gpu_blocks x block_size from vllm:cache_config_info; None when not reported."""
    cache = cache_config or {}
    blocks, size = cache.get("num_gpu_blocks", ""), cache.get("block_size", "")
    if not (str(blocks).isdigit() and str(size).isdigit()):
        return None
    return int(blocks) * int(size)


def declares_offload(info: Mapping[str, Any], counters: Mapping[str, float]) -> bool:
    """The arm says it has a KV connector: in its self-description, or by counting external
    prefix-cache queries or LMCache tokens (an engine without a connector counts neither)."""
    if info.get("connector"):
        return True
    keys = ("external_query_tokens", "lmcache_requested_tokens", "lmcache_stored_tokens")
    return any(counters.get(k, 0.0) > 0 for k in keys)


def _tokens(n: float | int | None) -> str:
    return "?" if n is None else f"{n:,.0f}"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def check_scenario(
    spec: WorkloadSpec,
    arm_names: list[str],
    infos: Mapping[str, Mapping[str, Any]],
    counters: Mapping[str, Mapping[str, float]],
    cached_shares: Mapping[str, float | None],
) -> ScenarioChecks:
    """The preconditions of one scenario (the first arm is the baseline), its arms' token
    sources, and what they change about the verdict."""
    base = arm_names[0]
    pre: list[Precondition] = []
    sources = {a: TokenSources.of(counters[a]) for a in arm_names if counters.get(a)}
    reuse = has_reuse(spec)
    need = working_set_tokens(spec)
    capacity = kv_capacity_tokens(infos.get(base, {}).get("cache_config"))
    note: str | None = None
    fits: bool | None = None
    if spec.trace is not None:
        pre.append(
            Precondition(
                "working_set",
                base,
                "unknown",
                "a replayed trace: its reuse and working set against GPU memory are what "
                "`kvops advise TRACE` measures",
            )
        )
    elif not reuse:
        note = NO_REUSE_NOTE
        pre.append(Precondition("reuse", base, "n/a", NO_REUSE_NOTE))
    elif capacity is None:
        pre.append(
            Precondition(
                "working_set",
                base,
                "unknown",
                f"working set about {_tokens(need)} tokens; the GPU KV capacity is unknown (no "
                "num_gpu_blocks in vllm:cache_config_info)",
            )
        )
    else:
        fits = need <= capacity
        shape = (
            f"{distinct_prefixes(spec)} prefixes x {_tokens(spec.prefix_tokens)} tokens + "
            f"{in_flight(spec)} requests in flight x "
            f"{_tokens(spec.suffix_tokens + spec.output_tokens)} = {_tokens(need)} tokens"
        )
        where = f"GPU KV capacity {_tokens(capacity)} tokens ({base})"
        if fits:
            note = FITS_NOTE
            pre.append(
                Precondition("working_set", base, "warn", f"{FITS_NOTE} ({shape} <= {where})")
            )
        else:
            pre.append(
                Precondition(
                    "working_set",
                    base,
                    "ok",
                    f"working set exceeds GPU memory ({shape} > {where}): "
                    "reuse must come from offload",
                )
            )
    verdict: str | None = None
    nothing_loaded: list[str] = []
    base_share = cached_shares.get(base)
    for cand in arm_names[1:]:
        src = sources.get(cand)
        if not declares_offload(infos.get(cand, {}), counters.get(cand, {})):
            if reuse:
                pre.append(
                    Precondition(
                        "offload_engaged",
                        cand,
                        "unknown",
                        f"arm {cand} shows no KV connector (no kv_connector, no lmcache: metrics, "
                        "no external prefix-cache queries): if it is meant to offload, "
                        "its connector "
                        "is not loaded",
                    )
                )
            continue
        loaded = src.offload_tokens if src is not None else None
        share = cached_shares.get(cand)
        if loaded is None and share is not None and base_share is not None:
            loaded = 1.0 if share > base_share + SHARE_MARGIN else 0.0
            how = f"cached-token share {_pct(share)} vs the baseline's {_pct(base_share)}"
        else:
            how = f"{_tokens(loaded)} prompt tokens loaded through the KV connector"
            if src is not None and src.share(loaded) is not None:
                how += f" ({_pct(src.share(loaded))} of {_tokens(src.looked_up_tokens)})"
        if loaded is None:
            pre.append(
                Precondition(
                    "offload_engaged",
                    cand,
                    "unknown",
                    f"arm {cand}: no load counter and no cached-token share",
                )
            )
            continue
        if loaded > 0:
            pre.append(Precondition("offload_engaged", cand, "ok", f"arm {cand}: {how}"))
            continue
        nothing_loaded.append(cand)
        if not reuse:
            pre.append(
                Precondition(
                    "offload_engaged",
                    cand,
                    "n/a",
                    f"arm {cand}: nothing loaded, as expected without reuse",
                )
            )
        elif fits:
            pre.append(
                Precondition(
                    "offload_engaged",
                    cand,
                    "n/a",
                    f"arm {cand}: nothing loaded, as expected: the GPU prefix cache held "
                    "the working set",
                )
            )
        else:
            pre.append(
                Precondition(
                    "offload_engaged",
                    cand,
                    "failed",
                    f"{NEVER_ENGAGED}: arm {cand} declares a KV connector but loaded "
                    f"nothing ({how}) "
                    "on a workload whose reuse the GPU cache cannot hold",
                )
            )
            if cand == arm_names[1]:
                verdict = NEVER_ENGAGED
    if reuse:
        if base_share is None:
            pre.append(
                Precondition(
                    "baseline_cache", base, "unknown", "the baseline reports no cached tokens"
                )
            )
        elif base_share <= 0.0:
            pre.append(
                Precondition(
                    "baseline_cache",
                    base,
                    "warn",
                    "the baseline served 0% of its prompt tokens from its GPU prefix cache on a "
                    "workload with shared prefixes: the request order or the cache size "
                    "decided the "
                    "result, not the storage",
                )
            )
        else:
            pre.append(
                Precondition(
                    "baseline_cache",
                    base,
                    "ok",
                    f"the baseline's cached-token share is {_pct(base_share)}",
                )
            )
    caveats: dict[str, dict[str, str]] = {}
    for cand in arm_names[1:]:
        theirs = kv_capacity_tokens(infos.get(cand, {}).get("cache_config"))
        if capacity is None or theirs is None:
            continue
        if abs(theirs - capacity) > CAPACITY_TOLERANCE * capacity:
            text = (
                f"GPU KV capacity differs: {base} {_tokens(capacity)} tokens, {cand} "
                f"{_tokens(theirs)} ({theirs / capacity - 1:+.0%}); batch sizes differ with it, "
                "the likely cause of a latency difference"
            )
            pre.append(Precondition("kv_capacity", cand, "warn", text))
            caveats[cand] = {
                m: f"KV capacity {theirs / capacity - 1:+.0%}: likely cause"
                for m in CAPACITY_SENSITIVE
            }
        else:
            pre.append(
                Precondition(
                    "kv_capacity",
                    cand,
                    "ok",
                    f"same GPU KV capacity as {base} ({_tokens(theirs)} tokens)",
                )
            )
    if verdict == NEVER_ENGAGED:
        mine = caveats.setdefault(arm_names[1], {})
        for m in CAPACITY_SENSITIVE:
            mine[m] = NEVER_ENGAGED + (f"; {mine[m]}" if m in mine else "")
    return ScenarioChecks(
        pre,
        sources,
        verdict,
        note,
        caveats,
        need if reuse else None,
        capacity,
        nothing_loaded,
    )


class Judged(Protocol):
    """A metric's verdict for one candidate arm (kvops.abtest.result_types.Comparison)."""

    candidate_arm: str
    verdict: str
    caveat: str | None


def attribute_gains(comparisons: Iterable[Judged], checks: ScenarioChecks) -> None:
    """A "helps" of an arm that loaded nothing through its connector is not offload's (see the
    module's "gain attribution"): it becomes NOT_FROM_OFFLOAD, the interval staying beside it.
    Changes the comparisons in place."""
    for c in comparisons:
        if c.verdict == "helps" and c.candidate_arm in checks.nothing_loaded:
            c.verdict = NOT_FROM_OFFLOAD
            why = f"measured as helps, but arm {c.candidate_arm} loaded no KV from offload"
            c.caveat = why + (f"; {c.caveat}" if c.caveat else "")


def overloaded_arms(lag_shares: Mapping[str, float | None]) -> dict[str, float]:
    """The arms whose simulated engine lagged beyond OVERLOAD_LAG_SHARE of their mean TTFT
    (arm -> share); servers that report no lag (real vLLM) are never among them."""
    return {a: s for a, s in lag_shares.items() if s is not None and s > OVERLOAD_LAG_SHARE}


def withhold_when_overloaded(
    comparisons: Iterable[Judged], overloaded: Mapping[str, float]
) -> None:
    """Every claim of a scenario in which an arm's simulated engine could not keep its model's
    schedule becomes HOST_OVERLOADED, the measured interval staying beside it: the paired
    comparison then measured the host's contention (which changes from segment to segment),
    not offload. A baseline that lagged voids the candidates' claims too. An invalid arm's
    verdict and "not enough trials" stand. Changes the comparisons in place."""
    if not overloaded:
        return
    late = ", ".join(f"{arm} {share:.0%}" for arm, share in sorted(overloaded.items()))
    for c in comparisons:
        if c.verdict in _TIMED_CLAIMS:
            why = f"measured as {c.verdict}, but simulated engines ran late ({late} of mean TTFT)"
            c.verdict = HOST_OVERLOADED
            c.caveat = why + (f"; {c.caveat}" if c.caveat else "")
