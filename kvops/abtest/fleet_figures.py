"""Per-instance figures of an arm of several endpoints, and its measured cross-instance hit
share: how much of what the arm's instances loaded from the shared store another instance had
computed.

Why this split and not a bare sum: a KV store shared by a fleet pays beyond a local one only
when an instance loads what another one stored. `kvops sim run --instances N` predicts that as
`cross_instance_hit_share` (loaded chunks another instance stored / all loaded chunks); this is
the same figure measured, under the same name, so the two compare.

How, from what a real fleet exposes:
- each instance's offload hit tokens come from its own counters, summed over the counted
  segments' measured iterations (`vllm:external_prefix_cache_hits`, else LMCache's
  `lmcache:num_hit_tokens`; `kvops.abtest.validity.TokenSources`). Neither vLLM nor LMCache
  says which process wrote a chunk it loaded.
- which instance wrote a prefix's chunks comes from the client's records: the instance sent the
  prefix's first request that succeeded (earliest send, warm-up and earlier trials included:
  the GDS tier never evicts, and an LMCache that finds a chunk stored skips its own put). A
  request is cross-instance when its prefix's writer is another instance of the arm.
- an instance's hits are split over its measured requests in proportion to the tokens each
  found cached (`usage.prompt_tokens_details.cached_tokens`; vLLM sends it with
  `--enable-prompt-tokens-details`): the cross-instance part is the share its cross-instance
  requests had. Where an instance loaded something and its records do not report cached
  tokens, its split is None ("not reported"), and so is the arm's share.
GPU prefix-cache hits count in `cached_tokens` too, so a cross-instance prefix an instance then
keeps in its GPU cache weighs in the split beyond its loads: the share is an attribution, exact
when each request's cached tokens are all loads. Pure: records and counters in, figures out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from kvops.abtest.engine_counters import Counters
from kvops.abtest.result_types import InstanceFigures
from kvops.abtest.validity import TokenSources
from kvops.workload.record import RequestRecord

# (arm, scenario, prefix id) -> the instance URL that computed the prefix first
Writers = dict[tuple[str, str, int], str]


def instance_url(request_url: str) -> str:
    """The instance's base URL of a record's request URL (`http://h:8000/v1/completions`)."""
    base, sep, _ = request_url.rpartition("/v1/")
    return base if sep else request_url.rstrip("/")


def prefix_writers(records: Iterable[RequestRecord]) -> Writers:
    """Who computed each shared prefix first: the instance sent its earliest successful
    request (every attempt counts: chunk files outlive an abandoned attempt)."""
    first: dict[tuple[str, str, int], tuple[float, str]] = {}
    for r in records:
        if r.prefix_id is None or not r.ok or not r.url:
            continue
        key = (r.arm, r.scenario, r.prefix_id)
        seen = first.get(key)
        if seen is None or r.send_time_unix_s < seen[0]:
            first[key] = (r.send_time_unix_s, instance_url(r.url))
    return {k: url for k, (_, url) in first.items()}


def is_cross_instance(record: RequestRecord, writers: Mapping[tuple[str, str, int], str]) -> bool:
    if record.prefix_id is None:
        return False
    writer = writers.get((record.arm, record.scenario, record.prefix_id))
    return writer is not None and writer != instance_url(record.url)


def _cross_tokens(
    hits: float | None, recs: Sequence[RequestRecord], writers: Mapping[tuple[str, str, int], str]
) -> float | None:
    """The part of an instance's offload hits its cross-instance requests account for."""
    if hits is None:
        return None
    if hits == 0:
        return 0.0
    ok = [r for r in recs if r.ok]
    if not ok or any(r.cached_tokens is None for r in ok):
        return None
    cached = sum(r.cached_tokens or 0 for r in ok)
    cross = sum(r.cached_tokens or 0 for r in ok if is_cross_instance(r, writers))
    return hits * cross / cached if cached else None


def instance_figures(
    urls: Sequence[str],
    measured: Sequence[RequestRecord],
    counters: Mapping[str, Counters],
    writers: Mapping[tuple[str, str, int], str],
) -> list[InstanceFigures]:
    """Each instance's figures (in `urls` order) from the arm's measured records of one
    scenario and each instance's summed counter deltas (absent: its /metrics gave none)."""
    out = []
    for url in urls:
        recs = [r for r in measured if instance_url(r.url) == url]
        ttfts = [r.ttft_ms for r in recs if r.ok and r.ttft_ms is not None]
        src = TokenSources.of(counters[url]) if url in counters else None
        hits = src.offload_tokens if src is not None else None
        cross = _cross_tokens(hits, recs, writers)
        out.append(
            InstanceFigures(
                url=url,
                requests=len(recs),
                errors=sum(1 for r in recs if not r.ok),
                mean_ttft_ms=float(np.mean(ttfts)) if ttfts else None,
                median_ttft_ms=float(np.median(ttfts)) if ttfts else None,
                gpu_hit_tokens=src.gpu_cache_tokens if src is not None else None,
                offload_hit_tokens=hits,
                stored_tokens=src.stored_tokens if src is not None else None,
                cross_instance_hit_tokens=cross,
                cross_instance_hit_share=cross / hits if cross is not None and hits else None,
            )
        )
    return out


def cross_instance_hit_share(instances: Sequence[InstanceFigures]) -> float | None:
    """The arm's cross-instance hit tokens over all its offload hit tokens; None when nothing
    was loaded or an instance that loaded cannot be split."""
    hits = [i.offload_hit_tokens for i in instances]
    if any(h is None for h in hits) or not sum(h or 0.0 for h in hits):
        return None
    cross = [i.cross_instance_hit_tokens for i in instances]
    if any(c is None for c in cross):
        return None
    return sum(c or 0.0 for c in cross) / sum(h or 0.0 for h in hits)
