"""Each arm's failed KV loads per segment: what the engine counted and what its service log says.

Why: with `kv_load_failure_policy: recompute` (the role's setting) a storage fault costs no
request - vLLM recomputes what LMCache failed to load - so a run with a failing tier finishes
clean, and its verdict silently includes recomputed loads. ab-test counts them per segment over
the measured part (the same stretch as `kvops.abtest.engine_counters`) from:

- the engine's own counters where they exist: LMCache 0.5.6's
  `lmcache:get_blocking_failed_count` (its remote backend's failed gets; the GDS and disk
  backends count nothing, and vLLM 0.32 has no load-failure metric);
- the arm's service log, when one is given (`--service-log ARM=FILE`; the embedded engines' own
  logs always): the lines `kvops.parse.kv_load_failures` reads, written during the segment
  (the log is read from its size at the segment's start).

A source that was not there is absent, never zero: "not reported" and "none failed" differ.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvops.parse.kv_load_failures import LoadFailureLines

# LMCache colours its level names when it logs to a file (lmcache/logging.py)
_ANSI_SGR = re.compile(r"\x1b\[[0-9;]*m")
MAX_LINE_CHARS = 65536  # a line without end is read in pieces, never whole
FAILED_GETS = "lmcache_get_failed"  # kvops.abtest.engine_counters key
Json = dict[str, Any]


def log_size(path: Path) -> int:
    """Where the segment's part of the log starts (0 for a log not written yet)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_log_since(path: Path, offset: int) -> Json:
    """The failed-load lines the log got after `offset` (from its start when it shrank: a
    restarted engine's new log), as the segment record keeps them; {"error": ...} when it
    cannot be read."""
    found = LoadFailureLines()
    try:
        with path.open("rb") as fh:
            if fh.seek(0, 2) < offset:
                offset = 0
            fh.seek(offset)
            while raw := fh.readline(MAX_LINE_CHARS):
                found.add_line(_ANSI_SGR.sub("", raw.decode("utf-8", errors="replace")))
    except OSError as exc:
        return {"path": str(path), "error": exc.strerror or str(exc)}
    return {"path": str(path), **found.to_json()}


@dataclass
class FailedLoads:
    """One arm's failed KV loads over a scenario's counted segments' measured iterations.

    `failed_loads` counts loads, one per request whose KV did not all arrive, as a lower bound:
    the largest count any one source gives (vLLM's rescheduled plus failed requests, LMCache's
    short retrieves, its failed remote gets; at least 1 where only unreadable chunk files were
    logged, which count files, not loads). The other figures are None where their source was
    not read."""

    failed_loads: int
    sources: list[str]
    requests_recomputed: int | None = None
    tokens_recomputed: int | None = None
    requests_failed: int | None = None
    lmcache_short_retrieves: int | None = None
    lmcache_read_errors: int | None = None
    lmcache_failed_gets: float | None = None
    per_trial: list[Json] = field(default_factory=list)  # [{trial, failed_loads}]
    examples: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)

    def to_json(self) -> Json:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: Json) -> FailedLoads:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def detail(self) -> str:
        """The sources' own words, for one line of a report."""
        parts = []
        if self.requests_recomputed is not None:
            parts.append(
                f"vLLM rescheduled {self.requests_recomputed} request(s) to recompute "
                f"{self.tokens_recomputed or 0:,} tokens"
            )
        if self.requests_failed:
            parts.append(f"vLLM failed {self.requests_failed} request(s) (failure_policy=fail)")
        if self.lmcache_short_retrieves is not None:
            parts.append(f"LMCache retrieved short {self.lmcache_short_retrieves} time(s)")
        if self.lmcache_read_errors is not None:
            parts.append(f"{self.lmcache_read_errors} chunk file read(s) failed")
        if self.lmcache_failed_gets is not None:
            parts.append(f"{self.lmcache_failed_gets:,.0f} failed gets (lmcache counter)")
        return "; ".join(parts) or "no source"


def count_loads(requests: int, short_retrieves: int, failed_gets: float, read_errors: int) -> int:
    """Failed loads from the sources' counts (see `FailedLoads`)."""
    n = max(requests, short_retrieves, int(failed_gets))
    return n if n or not read_errors else 1


def _segment_count(log: Mapping[str, Any] | None, gets: float | None) -> int:
    if log is None or "error" in log:
        return count_loads(0, 0, gets or 0.0, 0)
    return count_loads(
        int(log.get("requests_recomputed", 0)) + int(log.get("requests_failed", 0)),
        int(log.get("lmcache_short_retrieves", 0)),
        gets or 0.0,
        int(log.get("lmcache_read_errors", 0)),
    )


def _add(total: int | float | None, more: Any) -> Any:
    return more if total is None else total + more


def failed_loads_by_arm(
    segments: list[Json], done: Mapping[tuple[str, int, str], str]
) -> dict[tuple[str, str], FailedLoads]:
    """(scenario, arm) -> its failed loads over the counted segments (those whose attempt is
    the one counted, `done`); absent where no segment had a log or the counter."""
    out: dict[tuple[str, str], FailedLoads] = {}
    trials: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for seg in segments:
        key = (str(seg.get("scenario")), int(seg.get("trial") or 0), str(seg.get("arm")))
        if done.get(key) != seg.get("attempt"):
            continue
        log = seg.get("service_log")
        log = log if isinstance(log, dict) else None
        counters = seg.get("engine_counters")
        gets = counters.get(FAILED_GETS) if isinstance(counters, dict) else None
        if log is None and gets is None:
            continue
        pair = (key[0], key[2])
        fl = out.setdefault(pair, FailedLoads(0, []))
        if gets is not None:
            fl.lmcache_failed_gets = _add(fl.lmcache_failed_gets, float(gets))
            if "lmcache:get_blocking_failed_count" not in fl.sources:
                fl.sources.append("lmcache:get_blocking_failed_count")
        if log is not None:
            source = f"service log {log.get('path', '?')}"
            if source not in fl.sources:
                fl.sources.append(source)
            if "error" in log:
                fl.log_errors.append(f"{log.get('path', '?')}: {log['error']}")
            else:
                for name in (
                    "requests_recomputed", "tokens_recomputed", "requests_failed",
                    "lmcache_short_retrieves", "lmcache_read_errors",
                ):  # fmt: skip
                    setattr(fl, name, _add(getattr(fl, name), int(log.get(name, 0))))
                room = 3 - len(fl.examples)
                fl.examples += [str(x) for x in log.get("examples", [])][: max(0, room)]
        n = _segment_count(log, gets)
        trials[pair][key[1]] = trials[pair].get(key[1], 0) + n
    for pair, fl in out.items():
        fl.per_trial = [{"trial": t, "failed_loads": n} for t, n in sorted(trials[pair].items())]
        fl.failed_loads = count_loads(
            (fl.requests_recomputed or 0) + (fl.requests_failed or 0),
            fl.lmcache_short_retrieves or 0,
            fl.lmcache_failed_gets or 0.0,
            fl.lmcache_read_errors or 0,
        )
    return out


def failed_load_warnings(failed: Mapping[tuple[str, str], FailedLoads]) -> list[str]:
    """One warning per scenario and arm whose KV loads failed: the verdict includes them."""
    out = []
    for (scenario, arm), fl in failed.items():
        if fl.failed_loads <= 0:
            continue
        out.append(
            f"{scenario}: arm {arm} had at least {fl.failed_loads} failed KV load(s) "
            f"({fl.detail()}): with kv_load_failure_policy recompute no request fails, so "
            "its figures and the verdict include loads that were recomputed, not served from "
            "the offload tier"
        )
    for (scenario, arm), fl in failed.items():
        for err in fl.log_errors[:1]:
            out.append(f"{scenario}: arm {arm}: the service log could not be read ({err})")
    return out
