"""`kvops advise` on a session trace: each turn's prompt is its whole context (the earlier
turns' new tokens and answers, then its own), and later turns follow in closed loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvops.advise.arms import Profiles, run_arm
from kvops.advise.trace import (
    ReadOptions,
    TraceError,
    load_workload,
    read_lines,
    word_tokenizer,
)
from kvops.advise.workload import PromptBuilder, Workload, measure_reuse
from kvops.sim.engine import EngineSettings
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.workload.record import RequestRecord

VOCAB = 128_256
PROFILES = Profiles(
    load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
)
LINES = [
    {"session_id": "a", "timestamp": 0, "input_length": 1024, "output_length": 100,
     "hash_ids": [1, 2]},
    {"session_id": "a", "delay": 1000, "input_length": 512, "output_length": 50,
     "hash_ids": [3]},
    {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 9]},
]  # fmt: skip


def _read(lines: list[dict[str, object]]) -> Workload:
    text = [json.dumps(x) for x in lines]
    return read_lines(text, "s.jsonl", ReadOptions(), word_tokenizer(VOCAB))


def test_each_turn_counts_its_whole_context_as_its_prompt() -> None:
    w = _read(LINES)
    reqs = {r.line: r for r in w.requests()}
    assert w.num_requests == 3
    assert [reqs[n].prompt_len for n in (1, 2, 3)] == [1024, 1024 + 100 + 512, 1024]
    builder = PromptBuilder(VOCAB, 512)
    first, second = builder.tokens(reqs[1]), builder.tokens(reqs[2])
    assert second.shape == (1636,) and np.array_equal(second[:1024], first)
    # the answer stands in as its own tokens, then the turn's new block 3
    assert not np.array_equal(second[1024:1124], first[:100])
    third = builder.tokens(reqs[3])
    assert np.array_equal(third[:512], first[:512]) and not np.array_equal(third[512:], first[512:])
    # the reuse the report quotes: turn 2 repeats turn 1 whole (4 chunks of 256), the lone
    # request repeats block 1 (2 chunks), across the two kinds of line
    reuse = measure_reuse(w, builder, 256)
    assert reuse.prompt_tokens == 1024 + 1636 + 1024
    assert reuse.reusable_tokens == 1024 + 512
    assert any("session trace: 1 session(s), 2 turns" in note for note in w.notes)


def test_a_later_turn_arrives_its_delay_after_the_previous_answer() -> None:
    w = _read(LINES)
    result = run_arm("baseline", w, PromptBuilder(VOCAB, 512), PROFILES, EngineSettings())
    assert result.completed == 3 and not result.rejected
    arrivals = sorted(result.arrivals_s)
    # two at 0 (the session's first turn, the lone request); the second turn after the first
    # turn's answer (100 tokens of decode: well past 0) plus its 1 s delay
    assert arrivals[:2] == [0.0, 0.0] and arrivals[2] > 1.0 + 100 * 1e-3
    # and the whole replay lasts past it, while an open-loop reading would have it all at 0
    assert result.last_finish_s > arrivals[2]


def test_a_turn_that_cannot_be_placed_is_an_error_even_when_lenient() -> None:
    lines = [*LINES, {"session_id": "b", "delay": 5, "input_length": 10, "output_length": 2}]
    with pytest.raises(TraceError, match=r"s.jsonl:4: session 'b' starts with a delay"):
        _read(lines)


def test_a_long_session_builds_its_prompts_without_recursion() -> None:
    turns = [{"session_id": "s", "timestamp": 0, "input_length": 3, "output_length": 1}]
    turns += [{"session_id": "s", "delay": 1, "input_length": 3, "output_length": 1}] * 4999
    w = _read(turns)
    last = max(w.requests(), key=lambda r: r.line)
    tokens = PromptBuilder(VOCAB, 512).tokens(last)
    assert last.prompt_len == 5000 * 4 - 1 and tokens.shape == (last.prompt_len,)


def test_records_of_a_trace_replay_point_to_the_trace(tmp_path: Path) -> None:
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "mine.trace.jsonl").write_text(json.dumps(LINES[0]) + "\n")
    record = RequestRecord(
        request_id="a0-mine/baseline/t0-l1", arm="baseline", scenario="mine", send_perf_s=1.0,
        chunk_offsets_ms=[5.0], prompt_tokens=1024, output_tokens=100,
    )  # fmt: skip
    (tmp_path / "records.jsonl").write_text(record.to_json() + "\n")
    w = load_workload(str(tmp_path / "records.jsonl"), ReadOptions(), VOCAB, "x")
    assert any("records of a trace replay (mine)" in note for note in w.notes)
