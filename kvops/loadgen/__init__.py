"""The async streaming load generator (aiohttp) behind `kvops smoke` and `kvops ab-test`.

Stable API (other commands rely on it; keep it backward compatible):

    from kvops.loadgen import Endpoint, CompletionRequest, RequestRecord, make_session, send_request

    async with make_session() as session:
        rec = await send_request(
            session,
            Endpoint(base_url="http://127.0.0.1:8000", model="llama-3.1-8b"),
            CompletionRequest(request_id="smoke-1", prompt=[1, 2, 3], output_tokens=16),
            timeout_s=120.0,          # whole request
            stall_timeout_s=30.0,     # silence between reads
        )
    rec.ok, rec.error, rec.http_status      # errors are results; nothing raises, nothing retries
    rec.ttft_ms, rec.itls_ms, rec.e2el_ms   # vllm bench serve definitions (first/each/last chunk)
    rec.prompt_tokens, rec.output_tokens, rec.cached_tokens   # from `usage`; None = not reported

The send (`rec.send_perf_s`, where TTFT starts) is the instant aiohttp writes the request, by a
trace hook of `make_session`'s sessions (`kvops.loadgen.client.send_stamp_trace()` adds it to a
session of your own; without it the send is the instant before the POST, as in vLLM's bench).

Other pieces: `JsonlWriter` / `read_records` (one JSON line per request, flushed as it
completes), `SseParser` (vLLM's SSE rules), and `kvops.loadgen.runner` (batches, Poisson
arrivals, concurrency caps, trace sessions in closed loop, dispatch-lag and in-flight
measurement, worker processes).
"""

from kvops.loadgen.client import CompletionRequest, Endpoint, make_session, send_request
from kvops.loadgen.sse import MalformedStreamError, SseParser
from kvops.workload.record import JsonlWriter, RequestRecord, iter_jsonl, read_records

__all__ = [
    "CompletionRequest",
    "Endpoint",
    "JsonlWriter",
    "MalformedStreamError",
    "RequestRecord",
    "SseParser",
    "iter_jsonl",
    "make_session",
    "read_records",
    "send_request",
]
