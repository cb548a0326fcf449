"""Failed KV loads as vLLM and LMCache write them to the service log.

Why the log: with `kv_load_failure_policy: recompute` (the role's setting) a KV load that fails
costs no request - vLLM recomputes the tokens - and neither engine counts it on /metrics for
LMCache's GDS and disk backends (vLLM 0.32 has no such metric; LMCache 0.5.6 counts only its
remote backend's failed gets, `lmcache:get_blocking_failed_count`, read beside this in
`kvops.abtest.engine_counters`). The lines, by source:

- vLLM's scheduler (`vllm/v1/core/sched/scheduler.py` `_handle_invalid_blocks`, vLLM 0.11+):
  "Recovered from KV load failure: N request(s) rescheduled (M tokens affected)." under the
  recompute policy; "Failing N request(s) due to KV load failure (failure_policy=fail, M tokens
  affected)" under the fail policy.
- LMCache 0.5.6's vLLM adapter (`lmcache/integration/vllm/vllm_v1_adapter.py`): "The number of
  retrieved tokens is less than the expected number of tokens!" once per request whose
  retrieve came back short (then its failed blocks go to vLLM).
- LMCache 0.5.6's GDS backend (`lmcache/v1/storage_backend/gds_backend.py` `_load_gds`):
  "GDS read failed for <path>: <error>" once per chunk file it could not read.

Pure: lines in, counts out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

VLLM_RECOVERED = re.compile(
    r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens affected\)"
)
VLLM_FAILED = re.compile(
    r"Failing (\d+) request\(s\) due to KV load failure \(failure_policy=fail, (\d+) tokens"
)
LMCACHE_SHORT_RETRIEVE = "The number of retrieved tokens is less than the expected number of tokens"
LMCACHE_READ_FAILED = "GDS read failed"
MAX_EXAMPLES = 3
MAX_EXAMPLE_CHARS = 300


@dataclass
class LoadFailureLines:
    """What one stretch of a service log says about failed KV loads."""

    lines: int = 0  # lines read
    requests_recomputed: int = 0  # vLLM: requests rescheduled to recompute
    tokens_recomputed: int = 0  # vLLM: tokens affected by those failures
    requests_failed: int = 0  # vLLM under failure_policy=fail: requests failed
    lmcache_short_retrieves: int = 0  # LMCache: requests whose retrieve came back short
    lmcache_read_errors: int = 0  # LMCache GDS backend: chunk files it could not read
    examples: list[str] = field(default_factory=list)  # the first few such lines

    @property
    def any(self) -> bool:
        return bool(
            self.requests_recomputed
            or self.requests_failed
            or self.lmcache_short_retrieves
            or self.lmcache_read_errors
        )

    def add_line(self, line: str) -> None:
        self.lines += 1
        hit = True
        if (m := VLLM_RECOVERED.search(line)) is not None:
            self.requests_recomputed += int(m[1])
            self.tokens_recomputed += int(m[2])
        elif (m := VLLM_FAILED.search(line)) is not None:
            self.requests_failed += int(m[1])
        elif LMCACHE_SHORT_RETRIEVE in line:
            self.lmcache_short_retrieves += 1
        elif LMCACHE_READ_FAILED in line:
            self.lmcache_read_errors += 1
        else:
            hit = False
        if hit and len(self.examples) < MAX_EXAMPLES:
            self.examples.append(line.strip()[:MAX_EXAMPLE_CHARS])

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def scan_lines(lines: Iterable[str]) -> LoadFailureLines:
    out = LoadFailureLines()
    for line in lines:
        out.add_line(line)
    return out
