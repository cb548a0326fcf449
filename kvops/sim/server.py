"""`kvops sim serve`: an OpenAI-compatible HTTP server over the simulated engine, in real time.

The engine runs in virtual time; one asyncio task steps it and sleeps until each step's real
deadline (start + virtual end x time_scale), then hands out every token that step produced. When
the event loop falls behind, tokens go out in a burst: the model's clock is never stretched to
match the wall clock, so the modelled latencies stay exact and only delivery is late (measured as
`kvops:sim_emission_lag_seconds`). A request's virtual arrival is the wall-clock moment its
handler started, mapped through the same scale: reading and parsing a 30K-token body is this
host's CPU, not the modelled server's, so it must not push the request later in the model. A
step never starts before every request that arrived by its start time has been added (parsing
a burst of requests takes the loop a while; the model sees the burst together, as it should).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import traceback
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvops import __version__
from kvops.sim.gds_files import GdsChunkWriter
from kvops.sim.model import Engine, EngineSettings, build_engine
from kvops.sim.openai_api import (
    ApiError,
    ChunkMaker,
    ParsedRequest,
    TokenIds,
    chat_text,
    completion_logprobs,
    decode_body,
    parse_request,
    prompt_key,
    usage,
)
from kvops.sim.profiles import ModelProfile, load_model
from kvops.sim.records import Request, SimRequestRecord
from kvops.sim.server_metrics import ServerMetrics
from kvops.sim.tokenizer import WordTokenizer

VERSION = f"kvops-sim-{__version__}"


@dataclass
class ServerConfig:
    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm-80gb"
    storage: str = "ontap-nfs-rdma-200g"
    settings: EngineSettings = field(default_factory=EngineSettings)
    served_model_name: str | None = None
    time_scale: float = 1.0
    seed: int = 0


class EngineDeadError(RuntimeError):
    """The engine loop failed; requests in flight get this instead of tokens."""


# Longest the engine waits (wall seconds, once per request) for a request that arrived before a
# step but is still being read; a slow upload must not stall everyone else's tokens.
ARRIVAL_WAIT_CAP_S = 0.25
SWITCH_INTERVAL_S = 0.0005


class _Stream:
    """Token events for one in-flight request: ints (token ids) then the final record."""

    def __init__(self, prompt_ids: TokenIds, seed: int) -> None:
        self.queue: asyncio.Queue[int | SimRequestRecord | EngineDeadError] = asyncio.Queue()
        self.key = prompt_key(seed, prompt_ids)
        self.rng = random.Random(self.key)


class SimServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.profile: ModelProfile = load_model(config.model)
        self.engine: Engine = build_engine(
            config.model, config.gpu, config.storage, config.settings
        )
        self.served_name = config.served_model_name or self.profile.hf_name
        self.tokenizer = WordTokenizer(self.profile.vocab_size)
        s = config.settings
        connector = "LMCacheConnectorV1" if s.offload else "none"
        cache_info = {
            "block_size": str(s.block_size),
            "num_gpu_blocks": str(self.engine.cache.num_blocks),
            "num_gpu_blocks_override": str(s.num_gpu_blocks_override),
            "gpu_memory_utilization": str(s.gpu_memory_utilization),
            "kv_cache_memory_bytes": str(s.kv_cache_memory_bytes),
            "enable_prefix_caching": "True",
            "cache_dtype": "auto",
            "kv_connector": connector,
            "kv_offload": str(s.offload),
            "kv_capacity_scale": str(s.kv_capacity_scale),
            # kvops-only: the GPU memory LMCache's GDS staging buffer takes from the KV cache,
            # and the CPU DRAM tier in front of GDS (what the ab-test report shows per arm)
            "lmcache_gds_buffer_mib": str(s.gds_buffer_reserved_mib),
            "lmcache_local_cpu_gb": str(
                s.lmcache.max_local_cpu_size if s.offload and s.lmcache.local_cpu else 0
            ),
        }
        self.metrics = ServerMetrics(self.engine, self.served_name, cache_info)
        self.writer: GdsChunkWriter | None = None
        offload = self.engine.offload
        if offload is not None and s.lmcache.gds_path and offload.persistent_level is not None:
            self.writer = GdsChunkWriter(
                s.lmcache.gds_path,
                self.profile.hf_name,
                s.tensor_parallel_size,
                self.profile.dtype,
                int(offload.chunk_bytes),
            )
            found = self.writer.scan()
            offload.preload(found)
            # chunks other engines sharing this directory store later are found on a miss
            offload.file_probe = self.writer.has_chunk
            offload.reader = self.writer.unreadable
            print(f"Read {len(found)} cache entries from persistent storage", file=sys.stderr)
        kv_tokens = self.engine.cache.num_blocks * s.block_size
        print(  # the lines vLLM logs at startup, which operators grep for
            f"GPU KV cache size: {kv_tokens:,} tokens\n"
            f"Maximum concurrency for {self.engine.max_model_len:,} tokens per request: "
            f"{kv_tokens / self.engine.max_model_len:.2f}x",
            file=sys.stderr,
        )
        self._streams: dict[str, _Stream] = {}
        self.dead_reason = ""
        # The last finished requests' modelled records (virtual seconds), for tests/debugging.
        self.recent_records: deque[SimRequestRecord] = deque(maxlen=1024)
        self._wakeup = asyncio.Event()
        self._real0 = 0.0
        self._loop_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        # requests whose handler started but which are not in the engine yet: (virtual arrival,
        # wall time after which no step waits for them any more)
        self._arriving: list[tuple[float, float]] = []
        self._arrived = asyncio.Event()
        self._writes: set[asyncio.Task[None]] = set()

    # ----- clock and engine loop ---------------------------------------------------------
    def _virtual_now(self) -> float:
        return (asyncio.get_running_loop().time() - self._real0) / self.config.time_scale

    async def _run_engine(self) -> None:
        """Step the engine forever; if the model ever fails, mark the server dead (503 on
        /health, as vLLM answers when its engine died) and fail the requests in flight."""
        try:
            await self._engine_loop()
        except Exception as exc:  # a model bug must not leave clients hanging
            self.dead_reason = f"{type(exc).__name__}: {exc}"
            traceback.print_exc(file=sys.stderr)
            print(f"engine loop died: {self.dead_reason}", file=sys.stderr)
            for stream in self._streams.values():
                stream.queue.put_nowait(EngineDeadError(self.dead_reason))

    async def _engine_loop(self) -> None:
        loop = asyncio.get_running_loop()
        scale = self.config.time_scale
        while True:
            if not self.engine.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._await_arrivals(self.engine.next_step_start_s())
            result = self.engine.step()
            if result is None:
                continue
            deadline = self._real0 + result.end_s * scale
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if result.token_request_ids:
                self.metrics.observe_lag(loop.time() - deadline)
            for rid in result.token_request_ids:
                stream = self._streams.get(rid)
                if stream is not None:
                    stream.queue.put_nowait(stream.rng.randrange(self.tokenizer.vocab_size))
            for record in result.finished:
                self.metrics.observe(record, scale)
                self.recent_records.append(record)
                stream = self._streams.get(record.request_id)
                if stream is not None:
                    stream.queue.put_nowait(record)
            self._log_failed_loads()
            if self.writer is not None and result.stored_chunk_hashes:
                task = asyncio.create_task(self._write_chunks(result.stored_chunk_hashes))
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)

    def _log_failed_loads(self) -> None:
        """Loads that met unreadable chunk files, in the words LMCache 0.5.6 and vLLM use for
        them (`gds_backend.py` `_load_gds`; `vllm_v1_adapter.py`; vLLM's scheduler
        `_handle_invalid_blocks` under kv_load_failure_policy recompute), one request each."""
        for failed in self.engine.take_failed():
            for detail in failed.why.values():
                print(f"LMCache ERROR: GDS read failed for {detail}", file=sys.stderr)
            print(
                f"LMCache ERROR: Request {failed.request_id}: The number of retrieved tokens is "
                "less than the expected number of tokens! This should not happen!",
                file=sys.stderr,
            )
            print(
                "WARNING: Recovered from KV load failure: 1 request(s) rescheduled "
                f"({failed.recomputed_tokens} tokens affected).",
                file=sys.stderr,
            )
            if self.writer is not None:
                self.writer.forget(list(failed.why))

    async def _await_arrivals(self, start_s: float) -> None:
        """Let the requests that arrived by `start_s` (virtual) but are still being read and
        parsed join the step that starts then, as they would in the model."""
        loop = asyncio.get_running_loop()
        held_from: float | None = None
        while True:
            now = loop.time()
            due = [give_up for arrival, give_up in self._arriving if arrival <= start_s]
            if not due or max(due) <= now:
                if held_from is not None:
                    self.metrics.observe_arrival_wait(now - held_from)
                return
            held_from = now if held_from is None else held_from
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), max(due) - now)

    async def _write_chunks(self, hashes: list[int]) -> None:
        assert self.writer is not None
        async with self._write_lock:
            try:
                await asyncio.to_thread(self.writer.write, hashes)
            except OSError as exc:
                print(f"GDS write failed: {exc}", file=sys.stderr)

    async def _on_startup(self, app: web.Application) -> None:
        self._real0 = asyncio.get_running_loop().time()
        self._loop_task = asyncio.create_task(self._run_engine())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    # ----- generation ----------------------------------------------------------------------
    def _add(self, parsed: ParsedRequest, rid: str, arrival_s: float) -> _Stream:
        """Put the request into the engine (ValueError for one that can never fit)."""
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)
        stream = _Stream(parsed.prompt_ids, self.config.seed)
        self.engine.add_request(Request(rid, arrival_s, parsed.prompt_ids, parsed.max_tokens))
        self._streams[rid] = stream
        self._wakeup.set()
        return stream

    async def _generate(
        self, stream: _Stream, rid: str
    ) -> AsyncGenerator[list[int | SimRequestRecord], None]:
        """Everything available for the request at each wake-up: token ids, then its record.
        Handing over all queued tokens at once lets a lagging server write a burst in one
        send instead of one per token."""
        finished = False
        try:
            while True:
                items = [await stream.queue.get()]
                while not stream.queue.empty():
                    items.append(stream.queue.get_nowait())
                batch: list[int | SimRequestRecord] = []
                for item in items:
                    if isinstance(item, EngineDeadError):
                        raise item
                    batch.append(item)
                finished = isinstance(batch[-1], SimRequestRecord)
                yield batch
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self.engine.abort(rid)

    async def _completion(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = (self._virtual_now(), asyncio.get_running_loop().time() + ARRIVAL_WAIT_CAP_S)
        arrival_s = arrival[0]
        self._arriving.append(arrival)
        try:
            # a burst of requests read in one go starts one handler each: let them all take
            # their arrival time before any of them spends CPU on parsing
            await asyncio.sleep(0)
            try:
                body = decode_body(await request.read())
            except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
                return _error(ApiError("request body is not valid JSON"))
            try:
                parsed = parse_request(
                    body, chat, self.tokenizer, self.served_name, self.engine.max_model_len
                )
            except ApiError as exc:
                return _error(exc)
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
            try:
                stream = self._add(parsed, rid, arrival_s)
            except ValueError as exc:
                return _error(ApiError(str(exc)))
            except EngineDeadError as exc:
                return _error(ApiError(f"engine dead: {exc}", 500, "InternalServerError"))
        finally:
            self._arriving.remove(arrival)
            self._arrived.set()
        maker = ChunkMaker(rid, self.served_name, chat)
        gen = self._generate(stream, rid)
        try:
            return await self._respond(request, parsed, maker, gen)
        finally:
            await gen.aclose()  # aborts the request in the engine if it did not finish
            if self._streams.pop(rid, None) is not None:  # cancelled before it ever started
                self.engine.abort(rid)

    async def _respond(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        maker: ChunkMaker,
        gen: AsyncIterator[list[int | SimRequestRecord]],
    ) -> web.StreamResponse:
        if not parsed.stream:
            return await self._respond_whole(parsed, maker, gen)
        # Headers go out as soon as the request is admitted, before its first token, as
        # vLLM's StreamingResponse does (Starlette sends http.response.start before the body
        # iterator runs): the per-response cost is paid at arrival, not in the step that
        # hands a whole batch its first tokens, where it would delay every other stream.
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        count = 0
        try:
            while True:
                batch = await gen.__anext__()
                out: list[bytes] = []
                record: SimRequestRecord | None = None
                for item in batch:
                    if not isinstance(item, int):
                        record = item
                        continue
                    count += 1
                    if count == 1 and parsed.chat:
                        out.append(maker.role_chunk())
                    finish = "length" if count == parsed.max_tokens else None
                    out.append(maker.token_chunk(self.tokenizer.decode_piece(item), finish))
                if out:
                    await response.write(b"".join(out))
                if record is not None:
                    break
            # Every stream of a step writes its last token before any stream pays for ending
            # its response (usage, [DONE], the chunked terminator, the handler's exit).
            await asyncio.sleep(0)
            tail = b""
            if parsed.include_usage:
                tail = maker.usage_chunk(usage(record.prompt_tokens, count, record.cached_tokens))
            await response.write(tail + b"data: [DONE]\n\n")
        except EngineDeadError as exc:
            # what vLLM's completion stream does when generation fails after the headers were
            # sent: an error event, then [DONE]
            error = ApiError(f"engine dead: {exc}", 500, "InternalServerError").body()
            await response.write(b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _respond_whole(
        self,
        parsed: ParsedRequest,
        maker: ChunkMaker,
        gen: AsyncIterator[list[int | SimRequestRecord]],
    ) -> web.Response:
        """A non-streaming request: one JSON body once the request finished (500 if the
        engine died before)."""
        words: list[str] = []
        tokens: list[int] = []
        try:
            while True:
                for item in await gen.__anext__():
                    if isinstance(item, int):
                        words.append(self.tokenizer.decode_piece(item))
                        tokens.append(item)
                    else:
                        use = usage(item.prompt_tokens, len(words), item.cached_tokens)
                        logprobs = None
                        if parsed.logprobs is not None:
                            key = prompt_key(self.config.seed, parsed.prompt_ids)
                            logprobs = completion_logprobs(key, tokens, words, parsed.tokens_as_ids)
                        return web.json_response(maker.full_body("".join(words), use, logprobs))
        except EngineDeadError as exc:
            return _error(ApiError(f"engine dead: {exc}", 500, "InternalServerError"))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._completion(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._completion(request, chat=True)

    # ----- the other endpoints -----------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead_reason else 200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self._streams)})

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.served_name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": self.profile.hf_name,
            "parent": None,
            "max_model_len": self.engine.max_model_len,
            "vocab_size": self.profile.vocab_size,  # kvops extension: valid ids are below it
        }
        return web.json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
            if not isinstance(body, dict):
                raise ApiError("request body must be a JSON object")
            if "messages" in body:
                ids = self.tokenizer.encode(chat_text(body["messages"]))
            elif isinstance(body.get("prompt"), str):
                ids = self.tokenizer.encode(body["prompt"])
            else:
                raise ApiError("prompt must be a string")
        except ApiError as exc:
            return _error(exc)
        except json.JSONDecodeError:
            return _error(ApiError("request body is not valid JSON"))
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.engine.max_model_len,
                "tokens": ids,
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except json.JSONDecodeError:
            return _error(ApiError("request body is not valid JSON"))
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return _error(ApiError("tokens must be a list of token ids"))
        bad = next((t for t in tokens if t < 0 or t >= self.tokenizer.vocab_size), None)
        if bad is not None:
            return _error(ApiError(f"Token id {bad} is out of vocabulary"))
        return web.json_response({"prompt": self.tokenizer.decode(tokens)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        return web.json_response({"success": self.engine.reset_prefix_cache()})

    async def prometheus(self, request: web.Request) -> web.Response:
        data = generate_latest(self.metrics.registry)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/load", self.load)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/metrics", self.prometheus)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app


def _error(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def serve(config: ServerConfig, host: str, port: int) -> None:
    """Run until interrupted (the `kvops sim serve` entry point)."""
    server = SimServer(config)
    # The chunk writer thread holds the GIL between its syscalls; by default Python lets a
    # thread keep it up to 5 ms, during which no token can be sent. Hand it back sooner (set
    # here, in the server's own process, not in whoever embeds a SimServer).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    web.run_app(
        server.app(),
        host=host,
        port=port,
        print=lambda _msg: print(f"kvops sim serve: listening on http://{host}:{port}", flush=True),
        access_log=None,
    )
