"""The offload smoke judge: evidence around one prompt sent twice → PASS/FAIL/SKIP findings.

Why a separate pure module: the runner (`kvops.smoke.run`) does all the I/O — metrics scrapes,
two streaming requests with an eviction in between, a listing of the chunk directory — and
records plain numbers. Judging those numbers needs no network, so it is unit-tested exhaustively
and an evidence document saved as JSON can be judged again offline.

What each item proves:
- `offload`: the engine has a second KV tier at all (a KV connector was queried, or LMCache
  metrics exist). Its absence is the headline failure "offload not configured".
- `eviction`: the prompt really left GPU memory before the re-send; otherwise a fast re-send
  would only show vLLM's ordinary prefix cache.
- `stored_tokens` / `retrieved_tokens`: LMCache's own counters rose on the first sends /
  re-sends.
- `external_hits`: vLLM counted prefix-cache hits from the connector on the re-send.
- `ttft`: the re-sends' median time to first token fell by a clear margin. Several prompts
  (3 by default), not one, so that one request delayed by a busy neighbour cannot decide it.
- `chunk_files`: new chunk files appeared in the storage directory (`--gds-dir`).
- `kv_correct`: one more fresh prompt, answered greedily with log-probabilities cold (computed
  from scratch) and again after the eviction (its KV from the offload tier), gave the same tokens
  and log-probabilities (`kvops.smoke.kv_check`): offload returned the right KV, not just bytes.
- `service_log`: this start's service log (`--service-log`) has none of the lines validate's
  GDS-066 fails on, above all LMCache's "degraded mode": LMCache failed to initialise and the
  server, healthy on /health, recomputes every request.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvops.checks.fleet import FleetResult, worst
from kvops.checks.lmcache import journal_problems
from kvops.checks.model import Finding, Severity, finding
from kvops.errors import RC
from kvops.parse._common import clip
from kvops.smoke.kv_check import (
    DEFAULT_LOGPROB_TOLERANCE,
    KvCheck,
    first_difference,
    largest_logprob_gap,
)

# Counters read at each phase (names without the `_total` suffix; the parser tries both).
LMCACHE_STORED = "lmcache:num_stored_tokens"
LMCACHE_HIT = "lmcache:num_hit_tokens"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
LOCAL_QUERIES = "vllm:prefix_cache_queries"
LOCAL_HITS = "vllm:prefix_cache_hits"
COUNTERS = (LMCACHE_STORED, LMCACHE_HIT, EXTERNAL_QUERIES, EXTERNAL_HITS, LOCAL_QUERIES, LOCAL_HITS)

# The re-send must be at least this much faster than the cold send (0.2 = 20 % lower TTFT).
DEFAULT_MIN_TTFT_DROP = 0.2
# A re-send that found at least this share of its prompt in the GPU prefix cache was not evicted.
RESIDENT_SHARE = 0.5


@dataclass(frozen=True)
class MetricsSnapshot:
    """The counters of interest at one moment; None means the server does not expose it."""

    counters: Mapping[str, float | None]
    has_lmcache: bool

    def get(self, name: str) -> float | None:
        return self.counters.get(name)


@dataclass(frozen=True)
class RequestResult:
    """One streaming request as the smoke saw it."""

    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int | None = None


@dataclass(frozen=True)
class ChunkFile:
    """A file in the chunk directory. `layout` is "lmcache" for `*.kvcache.safetensors` (LMCache's
    GDS backend), "lmcache-fs" for the `lmcache server` file tier's `*.data` objects, or
    "connector" for other `*.safetensors` (vLLM's ExampleConnector). `header_ok` is None when
    the header was not checked (connector files); for the headerless fs objects, whether the
    file has any bytes."""

    path: str
    size_bytes: int
    layout: str
    header_ok: bool | None = None


@dataclass(frozen=True)
class Eviction:
    """How the prompt was forced out of GPU memory: "reset_prefix_cache", "fillers" or "none"."""

    method: str
    detail: str
    filler_tokens: int = 0
    capacity_tokens: int | None = None


@dataclass(frozen=True)
class ServiceLog:
    """The engine's service log of this start, as far as the judge needs it: where it was read,
    how many lines it had, and those naming an LMCache problem (`problem_lines`)."""

    source: str
    lines: int
    problem_lines: Sequence[str] = field(default_factory=tuple)
    error: str | None = None  # why the log could not be read (the item SKIPs)


@dataclass(frozen=True)
class SmokeEvidence:
    """Everything the judge needs, in plain values (JSON round-trips via `to_dict`/`from_dict`)."""

    url: str
    model: str
    prompt_tokens: int  # per test prompt
    seed: int
    before: MetricsSnapshot  # before the first send
    after_first: MetricsSnapshot  # after the first (cold) send
    before_resend: MetricsSnapshot  # after the eviction, just before the re-send
    after_resend: MetricsSnapshot  # after the re-send
    first_sends: Sequence[RequestResult]  # each test prompt, cold
    resends: Sequence[RequestResult]  # the same prompts after the eviction
    eviction: Eviction
    gds_dir: str | None = None
    files_before_count: int = 0  # chunk files under gds_dir before the first send
    files_after_count: int = 0  # ... and after the re-send
    new_files: Sequence[ChunkFile] = field(default_factory=tuple)  # those not there before
    kv_check: KvCheck | None = None  # the correctness prompt's two answers
    service_log: ServiceLog | None = None  # --service-log, read after the run

    @property
    def resent_tokens(self) -> int:
        """Prompt tokens sent again after the eviction (the correctness prompt included)."""
        checked = self.kv_check.prompt_tokens if self.kv_check is not None else 0
        return self.prompt_tokens * len(self.resends) + checked

    @property
    def prompt_label(self) -> str:
        n = len(self.first_sends)
        if n == 1:
            return f"a {self.prompt_tokens:,}-token prompt"
        return f"{n} x {self.prompt_tokens:,}-token prompts"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> SmokeEvidence:
        def snap(d: Mapping[str, Any]) -> MetricsSnapshot:
            return MetricsSnapshot(dict(d["counters"]), bool(d["has_lmcache"]))

        return SmokeEvidence(
            url=str(data["url"]),
            model=str(data["model"]),
            prompt_tokens=int(data["prompt_tokens"]),
            seed=int(data["seed"]),
            before=snap(data["before"]),
            after_first=snap(data["after_first"]),
            before_resend=snap(data["before_resend"]),
            after_resend=snap(data["after_resend"]),
            first_sends=tuple(RequestResult(**r) for r in data["first_sends"]),
            resends=tuple(RequestResult(**r) for r in data["resends"]),
            eviction=Eviction(**data["eviction"]),
            gds_dir=data.get("gds_dir"),
            files_before_count=int(data.get("files_before_count", 0)),
            files_after_count=int(data.get("files_after_count", 0)),
            new_files=tuple(ChunkFile(**f) for f in data.get("new_files", ())),
            kv_check=KvCheck.from_dict(data["kv_check"]) if data.get("kv_check") else None,
            service_log=_service_log(data.get("service_log")),
        )


def _service_log(data: Mapping[str, Any] | None) -> ServiceLog | None:
    if not data:
        return None
    return ServiceLog(
        source=str(data["source"]),
        lines=int(data["lines"]),
        problem_lines=tuple(str(x) for x in data.get("problem_lines", ())),
        error=None if data.get("error") is None else str(data["error"]),
    )


# Each item is a finding with its id in the check catalog (kvops/checks/catalog.py, GDS-2xx), so
# smoke reports with validate's table, JSON and JUnit; the short names stay for `--json` readers.
ITEM_IDS = {
    "offload": "GDS-200",
    "eviction": "GDS-201",
    "stored_tokens": "GDS-202",
    "external_hits": "GDS-203",
    "retrieved_tokens": "GDS-204",
    "ttft": "GDS-205",
    "chunk_files": "GDS-206",
    "kv_correct": "GDS-207",
    "service_log": "GDS-208",
}
ITEM_NAMES = {check_id: name for name, check_id in ITEM_IDS.items()}


def item_name(item: Finding) -> str:
    """The smoke item a finding judges (`offload`, `ttft`, ...)."""
    return ITEM_NAMES[item.check_id]


def _finding(name: str, severity: Severity, message: str) -> Finding:
    return finding(ITEM_IDS[name], severity, message)


def _rise(a: MetricsSnapshot, b: MetricsSnapshot, name: str) -> float | None:
    """How much a counter rose from `a` to `b`; None when either side lacks it."""
    va, vb = a.get(name), b.get(name)
    if va is None or vb is None:
        return None
    return vb - va


def _tok(value: float) -> str:
    return f"{value:,.0f} tokens"


def judge_offload(ev: SmokeEvidence) -> Finding:
    """Is there a second KV tier? LMCache metrics, or a connector that was asked for the prompt."""
    queried = _rise(ev.before, ev.after_resend, EXTERNAL_QUERIES)
    if ev.after_resend.has_lmcache:
        return _finding("offload", Severity.PASS, "LMCache metrics present: an LMCache engine")
    if queried is not None and queried > 0:
        return _finding(
            "offload",
            Severity.PASS,
            f"a KV connector was queried for {_tok(queried)} (no LMCache metrics)",
        )
    why = (
        "vllm:external_prefix_cache_queries did not rise"
        if queried is not None
        else "no vllm:external_prefix_cache_queries metric"
    )
    return _finding(
        "offload",
        Severity.FAIL,
        f"offload not configured: no LMCache metrics and no KV connector was asked ({why}); "
        "start the engine with --kv-transfer-config naming a connector (e.g. LMCacheConnectorV1)",
    )


def judge_eviction(ev: SmokeEvidence) -> Finding:
    """The prompt must have left GPU memory, or a fast re-send proves nothing about offload."""
    if ev.eviction.method == "none":
        return _finding(
            "eviction",
            Severity.FAIL,
            f"could not force the prompt out of GPU memory: {ev.eviction.detail}",
        )
    local_hits = _rise(ev.before_resend, ev.after_resend, LOCAL_HITS)
    if local_hits is not None and local_hits >= RESIDENT_SHARE * ev.resent_tokens:
        return _finding(
            "eviction",
            Severity.FAIL,
            f"the prompt was still in GPU memory after {ev.eviction.method} "
            f"({ev.eviction.detail}): the re-send found {_tok(local_hits)} in the GPU prefix cache",
        )
    seen = "" if local_hits is None else f"; re-send found {_tok(local_hits)} in the GPU cache"
    return _finding("eviction", Severity.PASS, f"{ev.eviction.detail}{seen}")


def _judge_lmcache_counter(
    item: str,
    before: MetricsSnapshot,
    after: MetricsSnapshot,
    metric: str,
    rose_when: str,
    none_means: str,
) -> Finding:
    """One LMCache counter between two snapshots: SKIP on a non-LMCache engine, FAIL when the
    counter is missing or flat, PASS with the rise."""
    if not after.has_lmcache:
        return _finding(item, Severity.SKIP, "no LMCache metrics: not an LMCache engine")
    rose = _rise(before, after, metric)
    if rose is None:
        return _finding(item, Severity.FAIL, f"LMCache metrics present but no {metric}")
    if rose > 0:
        return _finding(item, Severity.PASS, f"{metric} rose by {_tok(rose)} {rose_when}")
    return _finding(item, Severity.FAIL, f"{metric} did not rise{none_means}")


def judge_stored(ev: SmokeEvidence) -> Finding:
    return _judge_lmcache_counter(
        "stored_tokens",
        ev.before,
        ev.after_first,
        LMCACHE_STORED,
        f"on the first sends of {ev.prompt_label}"
        + (" and the correctness prompt" if ev.kv_check is not None else ""),
        ": LMCache stored nothing",
    )


def judge_retrieved(ev: SmokeEvidence) -> Finding:
    return _judge_lmcache_counter(
        "retrieved_tokens",
        ev.before_resend,
        ev.after_resend,
        LMCACHE_HIT,
        "on the re-send",
        " on the re-send",
    )


def judge_external_hits(ev: SmokeEvidence) -> Finding:
    rose = _rise(ev.before_resend, ev.after_resend, EXTERNAL_HITS)
    if rose is None:
        return _finding(
            "external_hits", Severity.SKIP, "the server exposes no vllm:external_prefix_cache_hits"
        )
    if rose > 0:
        return _finding(
            "external_hits",
            Severity.PASS,
            f"vllm:external_prefix_cache_hits rose by {_tok(rose)} on the re-send "
            f"({rose / max(ev.resent_tokens, 1):.0%} of the re-sent prompt tokens)",
        )
    return _finding(
        "external_hits",
        Severity.FAIL,
        "vllm:external_prefix_cache_hits did not rise on the re-send: nothing came back "
        "from the offload tier",
    )


def judge_ttft(ev: SmokeEvidence, min_drop: float) -> Finding:
    cold = statistics.median(r.ttft_ms for r in ev.first_sends)
    warm = statistics.median(r.ttft_ms for r in ev.resends)
    drop = 1.0 - warm / cold if cold > 0 else 0.0
    change = f"{drop:.0%} lower" if drop >= 0 else f"{-drop:.0%} higher"
    text = (
        f"median TTFT {cold:.1f} ms cold → {warm:.1f} ms re-sent "
        f"({change}; needed ≥ {min_drop:.0%} lower)"
    )
    return _finding("ttft", Severity.PASS if drop >= min_drop else Severity.FAIL, text)


def _size(size_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size_bytes < 1024 or unit == "GiB":
            return f"{size_bytes:.0f} {unit}" if unit == "B" else f"{size_bytes:.1f} {unit}"
        size_bytes /= 1024
    return f"{size_bytes:.1f} GiB"


def judge_chunk_files(ev: SmokeEvidence) -> Finding:
    if ev.gds_dir is None:
        return _finding("chunk_files", Severity.SKIP, "no --gds-dir given")
    new = list(ev.new_files)
    if not new:
        return _finding(
            "chunk_files",
            Severity.FAIL,
            f"no new chunk files under {ev.gds_dir} ({ev.files_after_count} there, none new): "
            "nothing was written to storage, or this is not the engine's gds_path as seen here",
        )
    lmcache = [f for f in new if f.layout in ("lmcache", "lmcache-fs")]
    bad = [f for f in lmcache if f.header_ok is False]
    size = _size(sum(f.size_bytes for f in new))
    if bad:
        return _finding(
            "chunk_files",
            Severity.FAIL,
            f"{len(bad)} of {len(lmcache)} new LMCache chunk files have a bad header or size "
            f"(e.g. {bad[0].path})",
        )
    if any(f.layout == "lmcache-fs" for f in new):
        kind = "LMCache file-tier objects (the server's fs L2 adapter, *.data)"
    elif lmcache:
        kind = "LMCache chunk files (*.kvcache.safetensors)"
    else:
        kind = "connector files (*.safetensors)"
    return _finding(
        "chunk_files",
        Severity.PASS,
        f"{len(new)} new {kind} under {ev.gds_dir}, {size} "
        f"({ev.files_before_count} → {ev.files_after_count} files)",
    )


def judge_kv_correct(ev: SmokeEvidence, tolerance: float) -> Finding:
    """The correctness prompt's answer from offloaded KV must be the one computed from scratch."""
    check = ev.kv_check
    if check is None:
        return _finding("kv_correct", Severity.SKIP, "not checked (evidence without kv_check)")
    ref, off = check.reference, check.offloaded
    if not ref.tokens or not off.tokens:
        return _finding(
            "kv_correct",
            Severity.SKIP,
            "the server answered without logprobs: cannot compare greedy answers",
        )
    loaded = off.cached_tokens
    source = (
        f"the re-send found {_tok(loaded)} of {check.prompt_tokens:,} cached"
        if loaded is not None
        else "the server does not report cached tokens"
    )
    diff = first_difference(ref, off, tolerance)
    if diff is not None:
        return _finding(
            "kv_correct",
            Severity.FAIL,
            f"greedy answers to the same {check.prompt_tokens:,}-token prompt differ: "
            f"{diff.describe()} ({source}; logprob tolerance {tolerance:g})",
        )
    if ref.cached_tokens:  # an offload tier already held it (warm storage, a reused --seed)
        return _finding(
            "kv_correct",
            Severity.SKIP,
            f"the reference was not computed from scratch: {ref.cached_tokens:,} of its "
            f"{check.prompt_tokens:,} tokens were already cached (an earlier run with the same "
            "--seed?); run without --seed for a fresh prompt",
        )
    if loaded == 0:
        return _finding(
            "kv_correct",
            Severity.SKIP,
            "the correctness prompt's re-send was recomputed (0 cached tokens): no offloaded KV "
            "to check",
        )
    return _finding(
        "kv_correct",
        Severity.PASS,
        f"{len(ref.tokens)} greedy tokens identical, logprobs within {tolerance:g} (largest "
        f"difference {largest_logprob_gap(ref, off):.2g}), computed from scratch and from the "
        f"KV after the eviction; {source}",
    )


def judge_service_log(ev: SmokeEvidence) -> Finding:
    """validate's GDS-066 logic on this start's log: LMCache's degraded mode is a FAIL."""
    log = ev.service_log
    if log is None:
        return _finding(
            "service_log",
            Severity.SKIP,
            "no --service-log given: LMCache's degraded mode is written only to the log",
        )
    if log.error is not None:
        return _finding("service_log", Severity.SKIP, f"{log.source}: {log.error}")
    found, shown = journal_problems(list(log.problem_lines))
    if found:
        return finding(
            ITEM_IDS["service_log"],
            Severity.FAIL,
            f"{log.source}: " + "; ".join(found) + f'; first: "{clip(shown[0], 240)}"',
            "\n".join(shown),
        )
    return _finding(
        "service_log",
        Severity.PASS,
        f"{log.source}: {log.lines:,} lines, no LMCache fallback or ignored setting",
    )


def judge(
    ev: SmokeEvidence,
    min_ttft_drop: float = DEFAULT_MIN_TTFT_DROP,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> list[Finding]:
    """All items, in the order a reader follows the story."""
    return [
        judge_offload(ev),
        judge_service_log(ev),
        judge_eviction(ev),
        judge_stored(ev),
        judge_external_hits(ev),
        judge_retrieved(ev),
        judge_kv_correct(ev, logprob_tolerance),
        judge_ttft(ev, min_ttft_drop),
        judge_chunk_files(ev),
    ]


def overall(items: Sequence[Finding]) -> Severity:
    """FAIL if any item failed; PASS if at least one passed and none failed; else SKIP."""
    return worst(i.severity for i in items)


def exit_code(items: Sequence[Finding]) -> RC:
    """OK or FAIL (as for validate); COULD_NOT_RUN is the runner's `SmokeError`."""
    return RC.FAIL if overall(items) is Severity.FAIL else RC.OK


def report_dict(ev: SmokeEvidence, items: Sequence[Finding]) -> dict[str, Any]:
    """What `--json` adds to validate's document: the verdict, items by name, the evidence."""
    return {
        "status": str(overall(items)),
        "items": [
            {"name": item_name(i), "status": str(i.severity), "message": i.message} for i in items
        ],
        "evidence": ev.to_dict(),
    }


def as_fleet(target: str, items: Sequence[Finding]) -> FleetResult:
    """The judged engine as a one-host fleet, for validate's renderers (table, JSON, JUnit)."""
    return FleetResult(findings={target: [replace(i, host=target) for i in items]})
