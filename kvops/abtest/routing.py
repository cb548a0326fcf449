"""Which instance of an arm serves each request, when an arm is several endpoints
(`kvops ab-test --arm offload=URL1,URL2 --route R`).

Why routes rather than "spread it somehow": whether a KV store shared by a fleet pays depends on
where a prefix lands the second time. On the same instance it is a GPU prefix-cache hit (or a
load of that instance's own chunk files); on another, only the shared store can save the
prefill. The routes set that on purpose, from the request plan alone, so both arms of a trial
get the same spread and a rerun repeats it:

- `round-robin`: request k of a segment to instance k mod N, in send order (the production
  stack's `roundrobin` router, github.com/vllm-project/production-stack, routing_logic.py);
  a prefix lands wherever its requests fall.
- `prefix-affinity`: every request of shared prefix p to instance p mod N (what a
  prefix-aware router such as vllm-router's cache-aware policy aims at,
  https://blog.vllm.ai/2025/12/13/vllm-router-release.html): no prefix is reused across
  instances, so the shared store adds nothing a local one would not.
- `prefix-handoff`: the first request of prefix p in a segment to instance p mod N, each
  later one to the next instance after the one that served it last: every reuse crosses
  instances, the case only a shared store serves.

Requests without a shared prefix go round-robin among themselves under every route. Pure: the
experiment hands over the plan's prefix ids and gets instance indexes back.
"""

from __future__ import annotations

from collections.abc import Sequence

ROUTES = ("round-robin", "prefix-affinity", "prefix-handoff")


def route_requests(prefix_ids: Sequence[int | None], instances: int, route: str) -> list[int]:
    """The instance index (0..instances-1) of each request, given in send order."""
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; known: {', '.join(ROUTES)}")
    if instances < 1:
        raise ValueError("an arm has at least one instance")
    out: list[int] = []
    unshared = 0  # round-robin position of the requests without a shared prefix
    visits: dict[int, int] = {}
    for k, prefix in enumerate(prefix_ids):
        if route == "round-robin":
            out.append(k % instances)
        elif prefix is None:
            out.append(unshared % instances)
            unshared += 1
        elif route == "prefix-affinity":
            out.append(prefix % instances)
        else:  # prefix-handoff
            seen = visits.get(prefix, 0)
            visits[prefix] = seen + 1
            out.append((prefix + seen) % instances)
    return out
