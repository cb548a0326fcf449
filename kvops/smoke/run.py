"""The I/O half of `kvops smoke`: talk to a running engine and gather `SmokeEvidence`.

Why this order of steps: offload is proven only if a prompt's KV went to the second tier and
came back from it. So the runner sends one long prompt (several LMCache chunks) cold, forces it
out of GPU memory, sends it again, and snapshots the server's counters around each step so the
judge (`kvops.smoke.judge`) can attribute every rise to the right request. A short warm-up request
first keeps first-request costs out of the cold TTFT. The prompt is drawn fresh from a seed
(reported) so a persistent offload tier cannot already hold it from an earlier run.

One more fresh prompt checks that the KV which comes back is the right one
(`kvops.smoke.kv_check`): asked greedily with log-probabilities right after the cold sends,
nothing can hold it yet, so vLLM computes its KV from scratch (the reference, which the offload
tier stores); asked again after the re-sends, its KV comes from the offload tier. A recomputed
reference needs no second engine and no switch on the server: the first, storing request is one.

Everything here either returns evidence or raises `SmokeError` with a one-line reason ("could
not run", exit 2); judging is left to `kvops.smoke.judge`.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from kvops.checks.lmcache import problem_lines
from kvops.errors import KvopsError
from kvops.loadgen import CompletionRequest, Endpoint, RequestRecord, make_session, send_request
from kvops.loadgen.client import read_text
from kvops.parse._common import MAX_LINE_CHARS
from kvops.parse.prometheus import PrometheusText, Sample, parse_prometheus_text
from kvops.smoke import chunk_files
from kvops.smoke.judge import (
    COUNTERS,
    LMCACHE_HIT,
    LMCACHE_STORED,
    ChunkFile,
    Eviction,
    MetricsSnapshot,
    RequestResult,
    ServiceLog,
    SmokeEvidence,
)
from kvops.smoke.kv_check import (
    Completion,
    CompletionShapeError,
    KvCheck,
    completion_body,
    parse_completion,
)

# Token ids used when the server has no /tokenize: low ids exist in every real vocabulary.
FALLBACK_TOKEN_IDS = range(100, 1000)
# Fillers must cover the reported KV capacity with room to spare, as LRU eviction is not exact.
FILLER_OVERSHOOT = 1.25
FILLER_MAX_TOKENS = 8192
HTTP_TIMEOUT_S = 30.0

Progress = Callable[[str], None]


class SmokeError(KvopsError):
    """The smoke could not run (unreachable server, failed request): exit 2, one-line reason."""


@dataclass(frozen=True)
class SmokeOptions:
    url: str
    model: str | None = None
    prompt_tokens: int = 2048
    prompts: int = 3
    output_tokens: int = 4
    gds_dir: Path | None = None
    timeout_s: float = 120.0
    seed: int | None = None
    evict: str = "auto"  # auto | reset | fillers
    # Read chunk files through this instead of gds_dir (e.g. over SSH: kvops.smoke.remote).
    chunks: ChunkSource | None = None
    # The engine's service log of this start, read after the run (LMCache's degraded mode):
    # a file here, or through this (e.g. the host's journal over SSH: kvops.smoke.remote).
    service_log: Path | None = None
    service_log_source: ServiceLogSource | None = None

    def read_service_log(self) -> ServiceLog | None:
        if self.service_log is not None:
            return read_service_log(self.service_log)
        if self.service_log_source is not None:
            return self.service_log_source.read()
        return None

    # offload_mp: LMCache's multiprocess server's HTTP frontend; its counters stand for LMCache's.
    lmcache_server_url: str | None = None

    def chunk_source(self) -> ChunkSource | None:
        if self.chunks is not None:
            return self.chunks
        return LocalChunks(self.gds_dir) if self.gds_dir else None


def _quiet(_: str) -> None:
    return None


class _Server:
    """Plain HTTP calls to one engine (the streaming request goes through kvops.loadgen)."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, lmcache_url: str | None = None
    ) -> None:
        self.session = session
        self.url = url.rstrip("/")
        self.lmcache_url = (lmcache_url or "").rstrip("/")
        self.chunk_size: int | None = None

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, absolute: bool = False
    ) -> tuple[int, str]:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        url = path if absolute else self.url + path
        try:
            async with self.session.request(
                method, url, json=body, timeout=timeout, headers={"Accept": "*/*"}
            ) as resp:
                return resp.status, await read_text(resp)
        except aiohttp.ClientConnectorError as exc:
            where = url if absolute else self.url
            raise SmokeError(f"cannot reach {where}: {exc.os_error or exc}") from None
        except TimeoutError:
            raise SmokeError(f"{method} {url}: no answer in {HTTP_TIMEOUT_S:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise SmokeError(f"{method} {url} failed: {exc}") from None

    async def json(
        self, method: str, path: str, body: dict[str, Any] | None = None, absolute: bool = False
    ) -> Any:
        """The answer's JSON; `absolute`: `path` is a whole URL (another server's)."""
        status, text = await self.call(method, path, body, absolute=absolute)
        if status != 200:
            raise SmokeError(f"{method} {path} answered HTTP {status}: {text.strip()[:200]}")
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise SmokeError(f"{method} {path} did not answer JSON: {text[:200]!r}") from None

    async def metrics(self) -> PrometheusText:
        status, text = await self.call("GET", "/metrics")
        if status != 200:
            raise SmokeError(
                f"GET /metrics answered HTTP {status}: the smoke judges offload from the "
                "server's Prometheus counters"
            )
        metrics = parse_prometheus_text(text)
        if self.lmcache_url:
            metrics.samples.extend(await self._lmcache_server_samples())
        return metrics

    async def _lmcache_server_samples(self) -> list[Sample]:
        """offload_mp: the LMCache server's counters, as LMCache's in-process names."""
        if self.chunk_size is None:
            config = await self.json("GET", self.lmcache_url + "/config", absolute=True)
            try:
                self.chunk_size = int(config["mp"]["chunk_size"])
            except (KeyError, TypeError, ValueError):
                raise SmokeError(
                    f"GET {self.lmcache_url}/config names no mp.chunk_size: is this an LMCache "
                    "server's HTTP frontend?"
                ) from None
        status, text = await self.call("GET", self.lmcache_url + "/metrics", absolute=True)
        if status != 200:
            raise SmokeError(f"GET {self.lmcache_url}/metrics answered HTTP {status}")
        return lmcache_server_counters(parse_prometheus_text(text), self.chunk_size)


# LMCache's multiprocess server (0.5.6) counts through OpenTelemetry
# (lmcache/v1/mp_observability/subscribers/metrics/: l1.py "lmcache_mp.l1_write", unit chunks;
# lookup.py "lmcache_mp.lookup_hit", unit tokens): chunks written to L1 (every stored chunk
# lands there first) and prefix tokens its lookups found in L1 or L2. Prometheus names carry the
# unit (OpenTelemetry's Prometheus exporter); without it for an exporter that drops units.
MP_L1_WRITES = ("lmcache_mp_l1_write_chunks", "lmcache_mp_l1_write")
MP_LOOKUP_HITS = ("lmcache_mp_lookup_hit_tokens", "lmcache_mp_lookup_hit")


def lmcache_server_counters(metrics: PrometheusText, chunk_size: int) -> list[Sample]:
    """The server's counters under the names the judge reads: stored tokens (L1 chunk writes x
    chunk size: only full chunks are stored) and hit tokens; nothing for a counter not yet
    published (it appears at its first increment), and the server's own samples alongside."""
    own = [s for s in metrics.samples if s.name.startswith("lmcache_mp_")]
    if not own:  # observability off: nothing to stand for LMCache's counters
        return []
    aliases = []
    for names, alias, scale in (
        (MP_L1_WRITES, LMCACHE_STORED, chunk_size),
        (MP_LOOKUP_HITS, LMCACHE_HIT, 1),
    ):
        value = next((v for v in map(metrics.counter_value, names) if v is not None), None)
        aliases.append(Sample(alias, {}, (value or 0.0) * scale))  # unpublished: still zero
    return own + aliases


# Names older vLLM releases used (removed in 0.11-0.12) for the same counters.
OLD_NAMES = {
    "vllm:prefix_cache_queries": "vllm:gpu_prefix_cache_queries",
    "vllm:prefix_cache_hits": "vllm:gpu_prefix_cache_hits",
}


def snapshot(metrics: PrometheusText) -> MetricsSnapshot:
    counters: dict[str, float | None] = {}
    for name in COUNTERS:
        value = metrics.counter_value(name)
        if value is None and name in OLD_NAMES:
            value = metrics.counter_value(OLD_NAMES[name])
        counters[name] = value
    return MetricsSnapshot(counters, metrics.has_prefix("lmcache:"))


def kv_capacity_tokens(metrics: PrometheusText) -> int | None:
    """num_gpu_blocks x block_size from `vllm:cache_config_info` labels, when reported."""
    for sample in metrics.find("vllm:cache_config_info"):
        try:
            blocks = int(sample.labels["num_gpu_blocks"])
            block = int(sample.labels["block_size"])
        except (KeyError, ValueError):
            continue
        if blocks > 0 and block > 0:
            return blocks * block
    return None


# LMCache publishes its counters from a stats thread every 10 s (lmcache/v1/cache_engine.py,
# `LMCacheStatsLogger(metadata, log_interval=10)` in 0.5.6): right after a request they can still
# read the old value.
LMCACHE_PUBLISH_S = 12.0


async def _settled(
    server: _Server, lmcache_rise: tuple[MetricsSnapshot, str] | None = None
) -> MetricsSnapshot:
    """Counters may land a moment after the stream ends; read until two reads agree (≤ 2 s).

    `lmcache_rise` (snapshot, LMCache counter): on an LMCache engine, also wait (≤ 12 s) for that
    counter to rise above the snapshot's value, as LMCache publishes with a delay; a counter that
    stays flat is then judged as flat, only later."""
    last = snapshot(await server.metrics())
    for _ in range(8):
        await asyncio.sleep(0.25)
        now = snapshot(await server.metrics())
        if now == last:
            break
        last = now
    if lmcache_rise is None or not last.has_lmcache:
        return last
    base, name = lmcache_rise
    deadline = asyncio.get_running_loop().time() + LMCACHE_PUBLISH_S
    while asyncio.get_running_loop().time() < deadline:
        was, now_value = base.get(name), last.get(name)
        if was is None or now_value is None or now_value > was:
            break
        await asyncio.sleep(0.5)
        last = snapshot(await server.metrics())
    return last


def list_chunk_files(root: Path) -> set[str]:
    """Every finished `*.safetensors` under root (LMCache GDS chunks or connector files);
    `*.tmp*` files are writes in flight and not counted."""
    try:
        return set(chunk_files.list_paths(str(root)))
    except OSError as exc:
        raise SmokeError(f"cannot list {exc.filename or root}: {exc.strerror}") from None


def describe_chunk_file(path: str) -> ChunkFile:
    """Size and, for LMCache's layout, whether the 4096-byte header matches the file size."""
    return ChunkFile(**chunk_files.describe(path))


class ServiceLogSource(Protocol):
    """Where the service log of this start is read when it is not a local file."""

    def read(self) -> ServiceLog: ...


class ChunkSource(Protocol):
    """Where the chunk files are read: this machine's mount, or the GPU host over SSH."""

    @property
    def where(self) -> str: ...

    def paths(self) -> set[str]: ...

    def details(self, paths: list[str]) -> list[ChunkFile]: ...


@dataclass(frozen=True)
class LocalChunks:
    root: Path

    @property
    def where(self) -> str:
        return str(self.root)

    def paths(self) -> set[str]:
        return list_chunk_files(self.root)

    def details(self, paths: list[str]) -> list[ChunkFile]:
        return [describe_chunk_file(p) for p in paths]


class SmokeRunner:
    """One smoke run against one engine; `run()` returns the evidence."""

    def __init__(self, opts: SmokeOptions, progress: Progress = _quiet) -> None:
        self.opts = opts
        self.progress = progress
        self.seed = opts.seed if opts.seed is not None else time.time_ns() % 2**31
        self.rng = random.Random(self.seed)
        self.count = 0

    async def run(self) -> SmokeEvidence:
        async with make_session() as session:
            server = _Server(session, self.opts.url, self.opts.lmcache_server_url)
            return await self._run(session, server)

    async def _run(self, session: aiohttp.ClientSession, server: _Server) -> SmokeEvidence:
        opts = self.opts
        model, max_len = await self._model(server)
        endpoint = Endpoint(base_url=server.url, model=model)
        pool = await self._token_pool(server, model)
        prompt_tokens = opts.prompt_tokens
        if max_len is not None:
            prompt_tokens = min(prompt_tokens, max_len - opts.output_tokens - 1)
        self.progress(
            f"{server.url}: model {model}, {opts.prompts} prompts of {prompt_tokens:,} tokens"
        )

        await self._send(session, endpoint, self._prompt(pool, 16), "warm-up")
        before = snapshot(await server.metrics())
        source = opts.chunk_source()
        files_before = await asyncio.to_thread(source.paths) if source else set()

        prompts = [self._prompt(pool, prompt_tokens) for _ in range(opts.prompts)]
        check_prompt = self._prompt(pool, prompt_tokens)
        first = [
            await self._send(session, endpoint, p, f"prompt {i + 1} cold")
            for i, p in enumerate(prompts)
        ]
        reference = await self._greedy(server, model, check_prompt, "correctness prompt cold")
        after_first = await _settled(server, (before, LMCACHE_STORED))

        eviction = await self._evict(session, server, endpoint, pool, max_len)
        before_resend = await _settled(server)
        resend = [
            await self._send(session, endpoint, p, f"prompt {i + 1} re-sent")
            for i, p in enumerate(prompts)
        ]
        offloaded = await self._greedy(server, model, check_prompt, "correctness prompt re-sent")
        after_resend = await _settled(server, (before_resend, LMCACHE_HIT))

        new: list[ChunkFile] = []
        files_after: set[str] = set()
        if source:
            files_after = await self._files_after(
                source, files_before, wait=after_resend.has_lmcache
            )
            new = await asyncio.to_thread(source.details, sorted(files_after - files_before))
        return SmokeEvidence(
            url=server.url,
            model=model,
            prompt_tokens=prompt_tokens,
            seed=self.seed,
            before=before,
            after_first=after_first,
            before_resend=before_resend,
            after_resend=after_resend,
            first_sends=tuple(first),
            resends=tuple(resend),
            eviction=eviction,
            gds_dir=source.where if source else None,
            files_before_count=len(files_before),
            files_after_count=len(files_after),
            new_files=tuple(new),
            kv_check=KvCheck(prompt_tokens, reference, offloaded),
            service_log=await asyncio.to_thread(opts.read_service_log),
        )

    async def _greedy(
        self, server: _Server, model: str, prompt: list[int], what: str
    ) -> Completion:
        """One non-streaming greedy answer with its tokens' log-probabilities."""
        doc = await server.json("POST", "/v1/completions", completion_body(model, prompt))
        try:
            answer = parse_completion(doc)
        except CompletionShapeError as exc:
            raise SmokeError(f"{what}: {exc}") from None
        cached = "" if answer.cached_tokens is None else f", {answer.cached_tokens:,} cached tokens"
        self.progress(f"{what}: {len(answer.tokens)} greedy tokens with logprobs{cached}")
        return answer

    async def _model(self, server: _Server) -> tuple[str, int | None]:
        """The model to use (given, or the first listed) and its max_model_len when reported."""
        listing = await server.json("GET", "/v1/models")
        models = [m for m in listing.get("data", []) if isinstance(m, dict) and "id" in m]
        if not models:
            raise SmokeError("GET /v1/models lists no model")
        chosen = next((m for m in models if m["id"] == self.opts.model), None)
        if self.opts.model and chosen is None:
            names = ", ".join(str(m["id"]) for m in models)
            raise SmokeError(f"model {self.opts.model!r} not served (served: {names})")
        chosen = chosen or models[0]
        max_len = chosen.get("max_model_len")
        return str(chosen["id"]), int(max_len) if isinstance(max_len, int) else None

    async def _token_pool(self, server: _Server, model: str) -> list[int]:
        """Token ids the model surely knows: those its tokenizer gives for seeded words."""
        words = " ".join(f"w{self.rng.randrange(10**6)} x{i}" for i in range(200))
        status, text = await server.call("POST", "/tokenize", {"model": model, "prompt": words})
        if status == 200:
            try:
                tokens = json.loads(text).get("tokens", [])
            except (json.JSONDecodeError, AttributeError):
                tokens = []
            pool = sorted({t for t in tokens if isinstance(t, int) and t > 2})
            if len(pool) >= 16:
                return pool
        return list(FALLBACK_TOKEN_IDS)

    def _prompt(self, pool: list[int], n: int) -> list[int]:
        return [self.rng.choice(pool) for _ in range(n)]

    async def _send(
        self, session: aiohttp.ClientSession, endpoint: Endpoint, prompt: list[int], what: str
    ) -> RequestResult:
        self.count += 1
        request = CompletionRequest(
            request_id=f"smoke-{self.seed}-{self.count}",
            prompt=prompt,
            output_tokens=self.opts.output_tokens,
            intended_prompt_tokens=len(prompt),
        )
        rec: RequestRecord = await send_request(
            session, endpoint, request, timeout_s=self.opts.timeout_s, stall_timeout_s=None
        )
        if not rec.ok or rec.ttft_ms is None:
            raise SmokeError(f"{what} failed: {rec.error or 'no token streamed'}")
        self.progress(
            f"{what}: TTFT {rec.ttft_ms:.1f} ms"
            + (f", {rec.cached_tokens:,} cached tokens" if rec.cached_tokens is not None else "")
        )
        return RequestResult(
            ttft_ms=rec.ttft_ms,
            prompt_tokens=rec.prompt_tokens or len(prompt),
            cached_tokens=rec.cached_tokens,
        )

    async def _evict(
        self,
        session: aiohttp.ClientSession,
        server: _Server,
        endpoint: Endpoint,
        pool: list[int],
        max_len: int | None,
    ) -> Eviction:
        """POST /reset_prefix_cache (GPU tier only) where served; otherwise filler prompts
        sized from the KV capacity the server reports."""
        if self.opts.evict in ("auto", "reset"):
            for _ in range(10):
                status, text = await server.call("POST", "/reset_prefix_cache")
                if status in (404, 405):
                    break
                if status == 200 and '"success":false' not in text.replace(" ", ""):
                    self.progress("evicted with POST /reset_prefix_cache")
                    return Eviction("reset_prefix_cache", "POST /reset_prefix_cache succeeded")
                await asyncio.sleep(0.5)  # blocks still held: vLLM asks to retry
            if self.opts.evict == "reset":
                return Eviction(
                    "none",
                    "POST /reset_prefix_cache is not served (vLLM needs VLLM_SERVER_DEV_MODE=1)",
                )
        capacity = kv_capacity_tokens(await server.metrics())
        if capacity is None:
            return Eviction(
                "none",
                "no /reset_prefix_cache and no KV capacity in the metrics "
                "(vllm:cache_config_info num_gpu_blocks x block_size) to size filler prompts",
            )
        size = min(FILLER_MAX_TOKENS, (max_len or FILLER_MAX_TOKENS) - self.opts.output_tokens - 1)
        count = math.ceil(FILLER_OVERSHOOT * capacity / size) + 1
        self.progress(f"evicting with {count} filler prompts of {size:,} tokens")
        for i in range(count):
            await self._send(session, endpoint, self._prompt(pool, size), f"filler {i + 1}/{count}")
        return Eviction(
            "fillers",
            f"{count} filler prompts of {size:,} tokens "
            f"(KV capacity {capacity:,} tokens reported by vllm:cache_config_info)",
            filler_tokens=count * size,
            capacity_tokens=capacity,
        )

    async def _files_after(self, source: ChunkSource, before: set[str], wait: bool) -> set[str]:
        """LMCache's GDS backend writes asynchronously: give new files up to 3 s to appear
        (connectors without LMCache metrics, like vLLM's ExampleConnector, write in-step)."""
        files = await asyncio.to_thread(source.paths)
        for _ in range(12 if wait else 0):
            if files - before:
                break
            await asyncio.sleep(0.25)
            files = await asyncio.to_thread(source.paths)
        return files


# LMCache colours its log level when it logs to a file too ("\x1b[31;20m... LMCache ERROR:\x1b[0m",
# lmcache/logging.py): the quoted lines drop the colour codes.
_ANSI_SGR = re.compile(r"\x1b\[[0-9;]*m")
# enough to quote each problem and count it; a log repeating one line forever stops here
MAX_PROBLEM_LINES = 1000


def read_service_log(path: Path) -> ServiceLog:
    """The lines of the engine's service log that name an LMCache problem (validate's GDS-066
    list), read after the run: LMCache reports its degraded mode once, at start."""
    count = 0
    found: list[str] = []
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            # a journal can be large: line by line, each cut at MAX_LINE_CHARS (a line without
            # end is read in pieces, never whole), and at most MAX_PROBLEM_LINES kept
            while line := fh.readline(MAX_LINE_CHARS):
                count += 1
                if len(found) < MAX_PROBLEM_LINES:
                    found += problem_lines([_ANSI_SGR.sub("", line)])
    except OSError as exc:
        raise SmokeError(f"cannot read the service log {path}: {exc.strerror}") from None
    return ServiceLog(str(path), count, tuple(found))


def run_smoke(opts: SmokeOptions, progress: Progress = _quiet) -> SmokeEvidence:
    """Gather evidence synchronously (the CLI's entry point); raises SmokeError."""
    return asyncio.run(SmokeRunner(opts, progress).run())
