"""`kvops ab-test --trace` against the two real vLLM engines of the role's variants (baseline,
and offload through the real LMCache): a Mooncake-format trace and a multi-turn session trace,
each replayed in both arms, ABBA over two trials.

What only a real engine can show: the replayed prompts are exactly the lengths the trace says
by vLLM's own count (a session turn's prompt is its whole context), the trace's prefix sharing
reaches vLLM's prefix cache, the session's earlier context is served from cache (GPU or
LMCache) on its later turns, and no trial replays another's prompts into LMCache's persistent
store. Each run's directory is kept under runs/engine/.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Engine

pytestmark = pytest.mark.timeout(1500)  # the first test may pay for the engine install

Cli = Callable[..., subprocess.CompletedProcess[str]]
RUNS = Path(__file__).resolve().parents[2] / "runs" / "engine"

MOONCAKE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1024, "output_length": 4, "hash_ids": [0, 2]},
    {"timestamp": 3000, "input_length": 700, "output_length": 4, "hash_ids": [3]},
]

# Three conversations of 1,920-token first turns: their contexts (5,800+ tokens) overflow the
# tier's 5,120-token KV cache, as agentic sessions outgrow a GPU's.
SESSIONS = [
    {"session_id": s, "timestamp": 300 * i, "input_length": 1920, "output_length": 4,
     "hash_ids": [10 * i + 1, 10 * i + 2, 10 * i + 3, 10 * i + 4]}
    for i, s in enumerate("abc")
] + [
    {"session_id": s, "delay": 100, "input_length": 200, "output_length": 4}
    for _ in range(2)
    for s in "abc"
]  # fmt: skip


def _ab_test(
    name: str, lines: list[dict[str, Any]], baseline: Engine, offload: Engine, cli: Cli
) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    out = RUNS / f"ab-trace-{name}"
    out.parent.mkdir(parents=True, exist_ok=True)
    trace = RUNS / f"trace-{name}.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = cli(
        "ab-test", "--arm", f"baseline={baseline.url}", "--arm", f"offload={offload.url}",
        "--trace", str(trace), "--trials", "2", "--out", str(out), "--overwrite", "--json",
        timeout_s=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert list(doc["scenarios"]) == [f"trace-{name}"]
    segments: dict[tuple[str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for text in (out / "records.jsonl").read_text().splitlines():
        rec = json.loads(text)
        segments[(rec["arm"], rec["trial"])][int(rec["request_id"].rsplit("-l", 1)[1])] = rec
    assert set(segments) == {(a, t) for a in ("baseline", "offload") for t in (0, 1)}
    for recs in segments.values():
        assert sorted(recs) == list(range(1, len(lines) + 1))
        assert all(r["error"] is None for r in recs.values()), recs
    return segments


def test_mooncake_trace_on_the_real_engines(
    baseline_engine: Engine, offload_engine: Engine, kvops_cli: Cli
) -> None:
    segments = _ab_test("mooncake", MOONCAKE, baseline_engine, offload_engine, kvops_cli)
    for (arm, trial), recs in segments.items():
        where = f"{arm}, trial {trial}"
        assert [recs[n]["prompt_tokens"] for n in (1, 2, 3)] == [1024, 1024, 700], where
        # line 2 starts with line 1's 512-token block 0 (four of vLLM's 128-token blocks)
        assert recs[2]["cached_tokens"] >= 512, where
        assert recs[3]["cached_tokens"] == 0, where
        # the first line of every segment is new to the engine: a fresh GPU cache, and (the
        # offload arm) nothing of the trial before in LMCache's store
        assert recs[1]["cached_tokens"] == 0, where


def test_session_trace_on_the_real_engines(
    baseline_engine: Engine, offload_engine: Engine, kvops_cli: Cli
) -> None:
    segments = _ab_test("sessions", SESSIONS, baseline_engine, offload_engine, kvops_cli)
    first, second, third = (1, 2, 3), (4, 5, 6), (7, 8, 9)
    for (arm, trial), recs in segments.items():
        where = f"{arm}, trial {trial}"
        # a later turn's prompt is its whole context, by vLLM's own count
        assert [recs[n]["prompt_tokens"] for n in first] == [1920] * 3, where
        assert [recs[n]["prompt_tokens"] for n in second] == [1920 + 4 + 200] * 3, where
        assert [recs[n]["prompt_tokens"] for n in third] == [2124 + 4 + 200] * 3, where
        for before, after in zip(first + second, second + third, strict=True):
            # closed loop: sent after the previous answer ended plus the 100 ms delay
            assert recs[after]["send_perf_s"] >= recs[before]["end_perf_s"] + 0.1 - 1e-3
        if arm == "offload":
            # the previous prompt comes back from cache on every later turn: from the GPU,
            # or from LMCache (full 256-token chunks) once the GPU evicted it
            for before, after in zip(first + second, second + third, strict=True):
                floor = recs[before]["prompt_tokens"] // 256 * 256
                assert recs[after]["cached_tokens"] >= floor, (where, after)
