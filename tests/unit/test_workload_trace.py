"""Reading traces as conversations placed in time (`kvops.workload.trace`), and the prompts a
replay sends (`kvops.workload.replay`): whole contexts, the same in every arm, fresh per trial."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvops.workload.generate import Alphabet
from kvops.workload.replay import (
    MAX_REPLAY_PROMPT_TOKENS,
    load_trace,
    plan_trace,
    trace_shape,
    trace_spec,
    word_ids,
)
from kvops.workload.spec import WorkloadSpecError
from kvops.workload.trace import (
    Trace,
    TraceError,
    TraceOptions,
    bounded_lines,
    read_trace,
)


def _read(objs: list[Any], **kw: Any) -> Trace:
    lines = [(n, json.dumps(o)) for n, o in enumerate(objs, start=1)]
    return read_trace(lines, "t.jsonl", TraceOptions(**kw), word_ids)


def _turn(**kw: Any) -> dict[str, Any]:
    return {"input_length": 600, "output_length": 10, **kw}


SESSION = [
    _turn(session_id="a", timestamp=1000, hash_ids=[1, 2]),
    _turn(session_id=7, timestamp=1500, hash_ids=[1]),
    _turn(session_id="a", delay=2000, input_length=100, hash_ids=[3]),
    _turn(timestamp=1200),
    _turn(session_id="a", delay=0, input_length=50, output_length=4),
]


def test_sessions_become_conversations_whose_contexts_grow() -> None:
    trace = _read(SESSION, hash_block_tokens=512)
    assert [c.key for c in trace.conversations] == ["a", "line 4", "7"]
    a, single, seven = trace.conversations
    assert (a.session, single.session, seven.session) == (True, False, True)
    # times shifted so the trace starts at 0; later turns keep their delay (ms -> s)
    assert (a.start_s, single.start_s, seven.start_s) == pytest.approx((0.0, 0.2, 0.5))
    assert [t.delay_s for t in a.turns] == [None, 2.0, 0.0]
    assert [t.line for t in a.turns] == [1, 3, 5]
    assert [a.context_tokens(k) for k in range(3)] == [600, 600 + 10 + 100, 710 + 10 + 50]
    assert trace.num_requests == 5 and trace.num_sessions == 2
    assert trace.warnings == [] and trace.timed


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_turn(timestamp=0), _turn(delay=5)], r"t.jsonl:2: delay without session_id"),
        ([_turn(timestamp=0), _turn()], r"t.jsonl:2: no timestamp .*cannot place it in time"),
        (
            [_turn(session_id="s", delay=5)],
            r"t.jsonl:1: session 's' starts with a delay.*give it a timestamp",
        ),
        (
            [_turn(session_id="s", timestamp=0), _turn(session_id="s")],
            r"t.jsonl:2: turn 2 of session 's' has neither a delay .* nor a timestamp",
        ),
        ([_turn(timestamp=0, delay=5, session_id="s")], r"t.jsonl:1: has both a time"),
        (
            [_turn(timestamp=0), _turn(session_id="s")],
            r"t.jsonl:2: the first turn of session 's' has no timestamp",
        ),
    ],
)
def test_a_line_that_cannot_be_placed_in_time_is_an_error_naming_it(
    lines: list[Any], message: str
) -> None:
    # not even a lenient read skips it: a session missing a turn would be another workload
    with pytest.raises(TraceError, match=message):
        _read(lines)


def test_a_trace_without_any_time_is_sent_at_once_and_says_so() -> None:
    trace = _read([_turn(), _turn(session_id="s")])
    assert [c.start_s for c in trace.conversations] == [0.0, 0.0]
    assert not trace.timed and "sent at once" in trace.warnings[0]


def test_a_later_turn_with_a_timestamp_keeps_it_as_its_earliest_time() -> None:
    trace = _read([_turn(session_id="s", timestamp=100), _turn(session_id="s", timestamp=900)])
    (conv,) = trace.conversations
    assert conv.turns[1].at_s == pytest.approx(0.8) and conv.turns[1].delay_s is None


def test_fields_kvops_does_not_use_are_named_with_their_lines() -> None:
    lines = [
        _turn(timestamp=0, extra={"nvext": 1}, messages=[]),
        _turn(timestamp=1, extra={}),
        _turn(timestamp=2, prompt_token_ids=[1, 2, 3]),  # input_length unused beside ids
        _turn(timestamp=3, arrival_s=1.0),  # arrival_s wins; timestamp unused
    ]
    warnings = _read(lines).warnings
    assert "field 'extra' is not used by kvops (line 1, 2)" in warnings[0]
    assert "field 'messages' is not used by kvops (line 1)" in warnings[1]
    assert "field 'input_length' is not used by kvops (line 3)" in warnings[2]
    assert "field 'timestamp' is not used by kvops (line 4)" in warnings[3]
    assert len(warnings) == 4


def test_unused_field_warnings_are_bounded() -> None:
    lines = [_turn(timestamp=0, **{f"k{i}": i for i in range(100)}) for _ in range(50)]
    warnings = _read(lines).warnings
    assert len(warnings) == 21
    assert "(line 1, 2, 3, 4, 5 and 45 more)" in warnings[0]
    assert "4000 more uses of other unused fields" in warnings[-1]


def test_malformed_turns_are_skipped_or_strict() -> None:
    lines = [_turn(timestamp=0), {"timestamp": 1, "output_length": 3}, ["x"]]
    trace = _read(lines)
    assert trace.num_requests == 1
    assert [s.split(":")[1] for s in trace.skipped] == ["2", "3"]
    with pytest.raises(TraceError, match=r"t.jsonl:2: no prompt.*--strict"):
        _read(lines, strict=True)
    with pytest.raises(TraceError, match="session_id must be"):
        _read([_turn(timestamp=0, session_id=["x"])], strict=True)
    with pytest.raises(TraceError, match="past the 30 days kvops waits"):
        _read([_turn(timestamp=0, session_id="s"), _turn(delay=1e12, session_id="s")], strict=True)
    with pytest.raises(TraceError, match="session_id must be 1 to 256"):
        _read([_turn(timestamp=0, session_id="x" * 300)], strict=True)


def test_a_line_past_the_bound_is_read_past_not_held() -> None:
    fh = io.StringIO("short\n" + "x" * 100 + "\nafter\n" + "y" * 50)
    got = list(bounded_lines(fh, limit=20))
    assert got == [(1, "short\n"), (2, None), (3, "after\n"), (4, None)]
    lines = [(1, json.dumps(_turn(timestamp=0))), (2, None)]
    trace = read_trace(lines, "t.jsonl", TraceOptions(), word_ids)
    assert "t.jsonl:2: longer than" in trace.skipped[0]


ALPHABET = Alphabet.from_vocab_size(32_000)


def _prompts(trace: Trace, trial: int, **kw: Any) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for session in plan_trace(trace, ALPHABET, trial=trial, run_seed=5, **kw):
        for turn in session.turns:
            prompt = turn.planned.request.prompt
            assert isinstance(prompt, list)
            out[turn.planned.index] = prompt
    return out


def test_a_replay_sends_whole_contexts_the_same_in_every_arm_fresh_each_trial() -> None:
    trace = _read(SESSION, hash_block_tokens=512)
    first, again, other = _prompts(trace, 0), _prompts(trace, 0), _prompts(trace, 1)
    assert first == again  # both arms of a trial send the same prompts
    assert [len(first[n]) for n in (1, 3, 5)] == [600, 710, 770]
    # a later turn starts with the previous turn's prompt (then its answer, then new tokens)
    assert first[3][:600] == first[1] and first[5][:710] == first[3]
    # the trace's shared block 1 is the same 512 tokens in session a and session 7
    assert first[1][:512] == first[2][:512] and first[1][512:] != first[2][512:600]
    # another trial: the same shape, no prompt and no block of the first trial's
    assert [len(other[n]) for n in (1, 3, 5)] == [600, 710, 770]
    assert other[1][:512] == other[2][:512] and other[1][:512] != first[1][:512]
    assert all(16 <= t < 32_000 for p in first.values() for t in p)


def test_scale_shrinks_blocks_prompts_and_answers_alike() -> None:
    trace = _read(SESSION, hash_block_tokens=512)
    prompts = _prompts(trace, 0, scale=0.25)
    assert [len(prompts[n]) for n in (1, 3, 5)] == [150, 150 + 2 + 25, 177 + 2 + 12]
    assert prompts[1][:128] == prompts[2][:128] and prompts[1][128:150] != prompts[2][128:150]
    shape = trace_shape(trace, 0.25)
    assert (shape.max_prompt_tokens, shape.max_output_tokens) == (191, 2)


def test_text_prompts_are_words_with_the_sharing_kept() -> None:
    lines = [
        {"timestamp": 0, "prompt": "alpha beta gamma delta", "output_tokens": 2},
        {"timestamp": 1, "text_input": "alpha beta epsilon", "output_tokens": 2},
    ]
    prompts = _prompts(_read(lines), 0)
    assert len(prompts[1]) == 4 and len(prompts[2]) == 3
    assert prompts[1][:2] == prompts[2][:2] and prompts[1][2] != prompts[2][2]


def test_trace_spec_names_the_replay_and_bounds_it(tmp_path: Path) -> None:
    path = tmp_path / "agent-traffic.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in SESSION))
    trace = load_trace(path)
    spec = trace_spec(path, trace, 1.0)
    assert (spec.name, spec.trace, spec.total_requests) == ("agent-traffic", str(path), 5)
    assert (spec.prompt_tokens, spec.output_tokens) == (770, 10)
    assert "5 requests in 2 sessions" in spec.description
    # sessions resend their context: 10 x (0.5 + 1 + 1.5 + 2 + 2.5) M prompt tokens
    huge = [_turn(session_id=s, timestamp=0, input_length=500_000) for s in range(10)] + [
        _turn(session_id=s, delay=1, input_length=500_000) for _ in range(4) for s in range(10)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in huge))
    with pytest.raises(WorkloadSpecError, match=f"exceed the {MAX_REPLAY_PROMPT_TOKENS:,}"):
        trace_spec(path, load_trace(path), 1.0)


def test_a_session_growing_past_any_models_context_is_refused() -> None:
    turns = [_turn(session_id="s", timestamp=0, input_length=3_000_000)]
    turns.append(_turn(session_id="s", delay=1, input_length=1_500_000))
    with pytest.raises(TraceError, match=r"t.jsonl:2: session 's' reaches a context of 4,500,010"):
        _read(turns)
    assert _read(turns[:1]).num_requests == 1


def test_load_trace_is_strict_and_refuses_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_turn(timestamp=0)) + "\nnot json\n")
    with pytest.raises(TraceError, match=r"t.jsonl:2: not JSON"):
        load_trace(path)
    path.write_text("\n")
    with pytest.raises(TraceError, match="no requests to replay"):
        load_trace(path)
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "missing.jsonl")


def test_hash_block_ids_never_collide_within_a_trial() -> None:
    lines = [_turn(timestamp=i, input_length=512, hash_ids=[h]) for i, h in enumerate((5, 6))]
    prompts = _prompts(_read(lines), 0)
    assert not np.array_equal(prompts[1][:16], prompts[2][:16])
