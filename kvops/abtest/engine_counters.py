"""The engine's own token counters, read from its `/metrics` before and after the measured part
of a segment: where each arm's prompt tokens came from.

Names (vLLM 0.34 `vllm/v1/metrics/loggers.py`, LMCache 0.5.6 `lmcache/observability.py`; both
counted in tokens): `vllm:prompt_tokens` (every prompt token of the requests scheduled),
`vllm:prefix_cache_hits` (served from vLLM's GPU prefix cache), `vllm:external_prefix_cache_hits`
and `_queries` (what the KV connector - LMCache - loaded, and was asked for),
`vllm:prompt_tokens_cached_by_source{source=...}` (cached tokens per tier), and LMCache's
`lmcache:num_hit_tokens`, `num_stored_tokens`, `num_retrieve_requests`, `put_failed_count`
(stores LMCache dropped) and `get_blocking_failed_count` (its remote backend's failed gets, the
one load failure LMCache 0.5.6 counts: `kvops.abtest.failed_loads`). A counter the server
does not expose is absent from the snapshot, never zero: "not reported" and "nothing loaded"
are different findings.

Pure: the client fetches the text; this module only reads it and subtracts.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvops.parse.prometheus import parse_prometheus_text

# snapshot key -> Prometheus counter name (read as `name` or `name_total`, summed over workers)
COUNTERS: dict[str, str] = {
    "prompt_tokens": "vllm:prompt_tokens",
    "gpu_hit_tokens": "vllm:prefix_cache_hits",
    "gpu_query_tokens": "vllm:prefix_cache_queries",
    "external_hit_tokens": "vllm:external_prefix_cache_hits",
    "external_query_tokens": "vllm:external_prefix_cache_queries",
    "lmcache_hit_tokens": "lmcache:num_hit_tokens",
    "lmcache_requested_tokens": "lmcache:num_requested_tokens",
    "lmcache_stored_tokens": "lmcache:num_stored_tokens",
    "lmcache_retrieve_requests": "lmcache:num_retrieve_requests",
    "lmcache_put_failed": "lmcache:put_failed_count",
    "lmcache_get_failed": "lmcache:get_blocking_failed_count",
}
BY_SOURCE = "vllm:prompt_tokens_cached_by_source"
SOURCE_PREFIX = "cached_by_source:"  # + the source label (device, host, disk, ...)

Counters = dict[str, float]


def read_counters(metrics_text: str) -> Counters:
    """The counters one `/metrics` scrape exposes (absent ones left out)."""
    parsed = parse_prometheus_text(metrics_text)
    out: Counters = {}
    for key, name in COUNTERS.items():
        value = parsed.counter_value(name)
        if value is not None:
            out[key] = value
    for sample in parsed.find(BY_SOURCE):
        source = sample.labels.get("source", "")
        if source:
            key = SOURCE_PREFIX + source
            out[key] = out.get(key, 0.0) + sample.value
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float]) -> Counters:
    """after - before for the counters present in both (a restarted server, whose counters went
    back, gives its after-value: what it counted since it started)."""
    out: Counters = {}
    for key, value in after.items():
        if key in before:
            out[key] = value - before[key] if value >= before[key] else value
    return out


def add_counters(total: Mapping[str, float], more: Mapping[str, float]) -> Counters:
    out = dict(total)
    for key, value in more.items():
        out[key] = out.get(key, 0.0) + value
    return out
