"""Noticing a warm persistent KV tier: cache hits that this run cannot explain.

Why: `/reset_prefix_cache` empties only the GPU prefix cache; LMCache's GDS (and local disk) tier
keeps every chunk it stored, across requests, resets and service restarts, and never evicts
(https://docs.lmcache.ai/ - storage backends). A run that repeats an earlier run's prompts (a
reused `--seed`, or two arms sharing one tier) then measures reads of old results, not the
configuration: a "unique" workload turns into a full cache hit.

How: within a run, a request's unique suffix is new to its server, so at most its shared prefix
can be served from cache. A request reporting more cached tokens than its prefix (plus a little
slack for chat templates) found its unique part in some tier: that tier was warm before it was
sent. Pure: records in, sentences out.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvops.workload.record import RequestRecord

# Tokens a request may show cached beyond its shared prefix without meaning anything (a chat
# template's fixed header is shared by every request); at most half the unique part.
SLACK_TOKENS = 64

CLEAR_HINT = (
    "clear it before measuring: run playbooks/deploy.yml with the LMCache storage cleared, or "
    "stop the service and empty the GDS directory (LMCache's gds_path / local_disk); a fresh "
    "--seed also avoids repeating earlier prompts"
)


def unexplained_hits(records: Iterable[RequestRecord], prefix_tokens: int) -> list[RequestRecord]:
    """Successful requests with more cached tokens than their shared prefix can explain."""
    out = []
    for r in records:
        if not r.ok or r.cached_tokens is None:
            continue
        shared = prefix_tokens if r.prefix_id is not None else 0
        unique = max(0, (r.prompt_tokens or r.intended_prompt_tokens or 0) - shared)
        if r.cached_tokens > shared + min(SLACK_TOKENS, unique // 2):
            out.append(r)
    return out


def warm_tier_warnings(
    records: Iterable[RequestRecord], prefix_tokens: int, scenario: str
) -> list[str]:
    """One loud sentence per arm whose requests were served from a tier warmed before the run."""
    by_arm: dict[str, list[RequestRecord]] = {}
    for r in unexplained_hits(records, prefix_tokens):
        by_arm.setdefault(r.arm, []).append(r)
    out = []
    for arm, hits in by_arm.items():
        first = min(hits, key=lambda r: r.send_time_unix_s)
        shared = prefix_tokens if first.prefix_id is not None else 0
        out.append(
            f"WARM CACHE TIER on arm {arm} ({scenario}): {len(hits)} request(s) found their "
            f"unique part already cached (e.g. {first.request_id}: {first.cached_tokens} of "
            f"{first.prompt_tokens} prompt tokens cached, shared prefix {shared}): "
            f"a persistent KV tier held these prompts before this run, so this arm's figures "
            f"measure old cache contents; {CLEAR_HINT}"
        )
    return out
