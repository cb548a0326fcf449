"""One record per request, appended to a JSONL file the moment the request completes.

Why a record per request and a flush per line: a crash or Ctrl-C must lose nothing already
measured, and `kvops ab-test --resume` rebuilds its state from these lines alone. Times are kept
raw (chunk arrival offsets from the send instant) so every metric can be recomputed later with
`vllm bench serve` definitions, rather than trusting summaries computed at run time.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO


@dataclass
class RequestRecord:
    """What happened to one request. Offsets are milliseconds after `send_perf_s` (the instant
    just before the POST, as in `vllm bench serve`); `error` is None only for a request that
    streamed to its end."""

    request_id: str
    url: str = ""
    arm: str = ""
    scenario: str = ""
    trial: int = 0
    iteration: int = 0
    batch: int = 0
    attempt: str = ""
    warmup: bool = False
    prefix_id: int | None = None
    intended_prompt_tokens: int | None = None
    intended_output_tokens: int | None = None
    send_time_unix_s: float = 0.0
    send_perf_s: float = 0.0
    end_perf_s: float = 0.0
    scheduled_perf_s: float | None = None
    dispatch_lag_ms: float | None = None
    client_queue_ms: float | None = None
    in_flight_at_send: int | None = None
    chunk_offsets_ms: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str = "usage"
    cached_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_ms(self) -> float | None:
        """Time to the first chunk that carries `choices` (vLLM's TTFT)."""
        return self.chunk_offsets_ms[0] if self.chunk_offsets_ms else None

    @property
    def e2el_ms(self) -> float | None:
        """Send to last `choices` chunk (vLLM's `latency`)."""
        return self.chunk_offsets_ms[-1] if self.chunk_offsets_ms else None

    @property
    def itls_ms(self) -> list[float]:
        """Gaps between successive `choices` chunks."""
        c = self.chunk_offsets_ms
        return [b - a for a, b in itertools.pairwise(c)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        """Tolerates keys from newer kvops versions (ignored) so old readers keep working."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class JsonlWriter:
    """Appends one JSON object per line and flushes each line to the OS at once.

    Thread-safe so worker-process relays and the event loop can share one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write_line(self, line: str) -> None:
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()

    def write_record(self, record: RequestRecord) -> None:
        self.write_line(record.to_json())

    def write_obj(self, obj: dict[str, Any]) -> None:
        self.write_line(json.dumps(obj, separators=(",", ":")))

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                os.fsync(self._fh.fileno())
                self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Reads a JSONL file, skipping a torn last line (a crash mid-write) instead of failing."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def read_records(path: Path) -> list[RequestRecord]:
    return [RequestRecord.from_dict(d) for d in iter_jsonl(path)]
