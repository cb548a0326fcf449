"""`kvops ab-test --trace` on the embedded engines: a Mooncake-format trace and a multi-turn
session trace replayed in both arms, ABBA, with their arrival order, their prefix structure and,
for sessions, the closed loop (a turn after the previous answer, prompting with the whole
context)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

SCALE = 0.25  # hash blocks of 128 tokens; every length below is quartered

MOONCAKE = [
    {"timestamp": 0, "input_length": 1200, "output_length": 12, "hash_ids": [0, 1, 2]},
    {"timestamp": 400, "input_length": 1800, "output_length": 8, "hash_ids": [0, 3, 4, 5]},
    {"timestamp": 600, "input_length": 1300, "output_length": 12, "hash_ids": [1, 4, 6]},
    {"timestamp": 200, "input_length": 700, "output_length": 8, "hash_ids": [0, 1]},
]

SESSIONS = [
    {"session_id": "a", "timestamp": 0, "input_length": 1024, "output_length": 16,
     "hash_ids": [10, 11]},
    {"session_id": "b", "timestamp": 200, "input_length": 1024, "output_length": 16,
     "hash_ids": [10, 12]},
    {"session_id": "a", "delay": 50, "input_length": 300, "output_length": 8, "hash_ids": [13]},
    {"session_id": "b", "delay": 30, "input_length": 512, "output_length": 8, "hash_ids": [14],
     "priority": 3},
    {"session_id": "a", "delay": 40, "input_length": 200, "output_length": 8},
]  # fmt: skip


def _run(tmp_path: Path, lines: list[dict[str, Any]], *extra: str) -> tuple[Any, Path]:
    trace = tmp_path / "traffic.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kvops", "ab-test", "--trace", str(trace), "--scale",
           str(SCALE), "--trials", "2", "--out", str(out), "--json", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240), out


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]


def _line(rec: dict[str, Any]) -> int:
    return int(rec["request_id"].rsplit("-l", 1)[1])


def _segments(recs: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    by: dict[tuple[str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in recs:
        by[(r["arm"], r["trial"])][_line(r)] = r
    return by


@pytest.mark.timeout(300)
def test_mooncake_trace_replays_in_both_arms_with_its_arrivals(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, MOONCAKE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert list(doc["scenarios"]) == ["traffic"]
    segments = _segments(_records(out))
    assert set(segments) == {(a, t) for a in ("baseline", "offload") for t in (0, 1)}
    for recs in segments.values():
        assert sorted(recs) == [1, 2, 3, 4]
        assert all(r["error"] is None and not r["warmup"] for r in recs.values())
        # lengths scaled by a quarter, exact through the engine's own count
        assert [recs[n]["prompt_tokens"] for n in (1, 2, 3, 4)] == [300, 450, 325, 175]
        # released in the trace's order (timestamps 0, 200, 400, 600 ms: lines 1, 4, 2, 3)
        sends = sorted(recs, key=lambda n: recs[n]["scheduled_perf_s"])
        assert sends == [1, 4, 2, 3]
        # the trace's prefix sharing reaches the engine's prefix cache (16-token blocks): line
        # 4 is line 1's blocks 0 and 1 (128-token blocks) cut at 175 tokens, line 2 starts
        # with block 0, line 3 shares blocks but no prefix
        assert [recs[n]["cached_tokens"] for n in (1, 2, 3, 4)] == [0, 128, 0, 160]
    # the run keeps its own copy of the trace, and the spec that points to it
    assert (out / "workloads" / "traffic.trace.jsonl").read_text().count("\n") == 4
    assert "trace: traffic.trace.jsonl" in (out / "workloads" / "traffic.yaml").read_text()


@pytest.mark.timeout(300)
def test_session_trace_replays_conversations_in_closed_loop(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, SESSIONS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "'priority' is not used by kvops (line 4)" in proc.stderr
    warnings = json.loads(proc.stdout)["warnings"]
    assert any("'priority' is not used by kvops (line 4)" in w for w in warnings)
    segments = _segments(_records(out))
    assert set(segments) == {(a, t) for a in ("baseline", "offload") for t in (0, 1)}
    for recs in segments.values():
        assert sorted(recs) == [1, 2, 3, 4, 5]
        assert all(r["error"] is None for r in recs.values())
        # each turn's prompt is the whole context: earlier new tokens and answers, then its own
        a1, a2, a3 = (recs[n]["prompt_tokens"] for n in (1, 3, 5))
        assert (a1, a2, a3) == (256, 256 + 4 + 75, 256 + 4 + 75 + 2 + 50)
        assert (recs[2]["prompt_tokens"], recs[4]["prompt_tokens"]) == (256, 256 + 4 + 128)
        # ... so the context of the previous turn comes from the GPU prefix cache
        assert recs[3]["cached_tokens"] >= 256 - 16 and recs[5]["cached_tokens"] >= 256 + 64
        # closed loop: a later turn is sent only after the previous answer ended + its delay
        for before, after, delay_s in ((1, 3, 0.05), (3, 5, 0.04), (2, 4, 0.03)):
            assert recs[after]["send_perf_s"] >= recs[before]["end_perf_s"] + delay_s - 1e-3
        # a session's first turn shares only block 10 with the other session's
        assert recs[1]["cached_tokens"] + recs[2]["cached_tokens"] == 128
    # every trial replays the structure with fresh tokens: the offload arm's persistent tier
    # never serves a trial the prompts of the one before (a reset GPU cache, nothing loaded)
    assert all(segments[(arm, 1)][1]["cached_tokens"] == 0 for arm in ("baseline", "offload"))


def test_a_line_that_cannot_be_placed_in_time_is_a_clear_error(tmp_path: Path) -> None:
    lines = [SESSIONS[0], {"input_length": 100, "output_length": 4, "delay": 10}]
    proc, out = _run(tmp_path, lines)
    assert proc.returncode == 2
    assert "traffic.jsonl:2: delay without session_id" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
