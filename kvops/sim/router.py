"""Request routers in front of a fleet of engine instances: which instance serves a request.

Why: whether a shared KV store pays across hosts depends on where requests land. A round-robin
router spreads every prefix over every instance, so each one misses in its own GPU cache on
prefixes another instance computed, and the shared store turns those misses into loads. A
prefix-aware router sends a prefix back where it went before, so the GPU caches of the fleet
hold the working set between them and the store sees the rest.

`prefix` follows the cache-aware policy of vLLM's production router (vllm-router, derived from
the SGLang model gateway; https://blog.vllm.ai/2025/12/13/vllm-router-release.html): the
instance whose past requests share the longest prefix with this one, when that share of the
prompt is at least `cache_threshold` (0.3); below it, the instance that has been sent the least;
and when the busiest instance has more than `balance_abs_threshold` (64) requests in flight over
the idlest and more than `balance_rel_threshold` (1.5) times as many, the idlest instead. The
production stack's `prefixaware` router (a hash trie of prompts, longest match, random choice
among equals; github.com/vllm-project/production-stack, routing_logic.py) is this policy with the
threshold at 0 and no balance guard. Prefixes are compared in LMCache chunks (the engine's chained
chunk hashes); ties go to the instance with fewer requests in flight, then to a seeded draw.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

ROUTERS = ("round-robin", "prefix")


class Router(Protocol):
    def choose(self, chunk_hashes: Sequence[int], in_flight: Sequence[int]) -> int:
        """The instance for a request with these chunk hashes, given requests in flight."""
        ...


class RoundRobin:
    """Instance 0, 1, ..., N-1, 0, ... in arrival order (production-stack's `roundrobin`)."""

    def __init__(self, instances: int) -> None:
        self.instances = instances
        self._next = 0

    def choose(self, chunk_hashes: Sequence[int], in_flight: Sequence[int]) -> int:
        chosen = self._next
        self._next = (chosen + 1) % self.instances
        return chosen


@dataclass(frozen=True)
class PrefixPolicy:
    """vllm-router's cache-aware defaults (`--cache-threshold`, `--balance-abs-threshold`,
    `--balance-rel-threshold`)."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5


class PrefixAware:
    """Longest shared prefix first, within a load-balance guard (module docstring)."""

    def __init__(self, instances: int, policy: PrefixPolicy = PrefixPolicy(), seed: int = 0):
        self.instances = instances
        self.policy = policy
        self._rng = random.Random(seed)
        # chunk hash -> instances sent a prompt holding it (chained hashes: a prefix trie)
        self._seen: dict[int, set[int]] = {}
        self._sent_chunks = [0] * instances

    def _pick(self, candidates: Sequence[int], in_flight: Sequence[int]) -> int:
        least = min(in_flight[i] for i in candidates)
        tied = [i for i in candidates if in_flight[i] == least]
        return tied[0] if len(tied) == 1 else self._rng.choice(tied)

    def longest_match(self, chunk_hashes: Sequence[int]) -> tuple[list[int], int]:
        """Instances sharing the longest prefix with this prompt, and its length in chunks."""
        candidates = set(range(self.instances))
        depth = 0
        for h in chunk_hashes:
            narrowed = candidates & self._seen.get(h, set())
            if not narrowed:
                break
            candidates = narrowed
            depth += 1
        return sorted(candidates), depth

    def choose(self, chunk_hashes: Sequence[int], in_flight: Sequence[int]) -> int:
        p = self.policy
        busiest, idlest = max(in_flight), min(in_flight)
        everyone = range(self.instances)
        if (
            busiest - idlest > p.balance_abs_threshold
            and busiest > p.balance_rel_threshold * idlest
        ):
            chosen = self._pick(everyone, in_flight)
        else:
            candidates, depth = self.longest_match(chunk_hashes)
            share = depth / len(chunk_hashes) if chunk_hashes else 0.0
            if depth and share >= p.cache_threshold:
                chosen = self._pick(candidates, in_flight)
            else:
                fewest = min(self._sent_chunks)
                chosen = self._pick(
                    [i for i in everyone if self._sent_chunks[i] == fewest], in_flight
                )
        for h in chunk_hashes:
            self._seen.setdefault(h, set()).add(chosen)
        self._sent_chunks[chosen] += len(chunk_hashes)
        return chosen


def make_router(
    name: str, instances: int, seed: int = 0, policy: PrefixPolicy = PrefixPolicy()
) -> Router:
    if name == "round-robin":
        return RoundRobin(instances)
    if name == "prefix":
        return PrefixAware(instances, policy, seed)
    raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
