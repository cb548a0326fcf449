"""SSE parsing with vLLM's rules, and records that survive a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvops.loadgen import JsonlWriter, MalformedStreamError, RequestRecord, SseParser, read_records
from kvops.loadgen.sse import MAX_EVENT_BYTES


def _chunk(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_token_events_split_across_reads() -> None:
    p = SseParser()
    data = _chunk({"choices": [{"text": "a"}]}) + _chunk({"choices": [{"text": ""}]})
    first = p.feed(data[:10])
    assert first.token_events == 0
    rest = p.feed(data[10:])
    assert rest.token_events == 2  # an empty text still counts, as in vLLM


def test_comments_usage_and_done() -> None:
    p = SseParser()
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 3},
    }
    ev = p.feed(b": keep-alive\n\n" + _chunk({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    assert ev.token_events == 0  # an empty choices list is not a token
    assert ev.usage == usage and ev.done and p.saw_done


def test_crlf_and_event_fields() -> None:
    ev = SseParser().feed(b'event: message\r\ndata: {"choices": [{"text": "x"}]}\r\n\r\n')
    assert ev.token_events == 1


def test_malformed_json_raises_with_snippet() -> None:
    with pytest.raises(MalformedStreamError, match="not json"):
        SseParser().feed(b"data: {not json\n\n")
    with pytest.raises(MalformedStreamError, match="not a JSON object"):
        SseParser().feed(b"data: [1, 2]\n\n")


def test_error_event_is_reported() -> None:
    ev = SseParser().feed(_chunk({"error": {"message": "engine dead"}}))
    assert ev.error is not None and "engine dead" in ev.error


def test_crlf_event_ends_split_across_every_read() -> None:
    data = b'data: {"choices": [{"text": "x"}]}\r\n\r\n' * 3
    p = SseParser()
    assert sum(p.feed(data[i : i + 1]).token_events for i in range(len(data))) == 3


def test_a_stream_without_event_ends_is_refused_at_a_bound() -> None:
    """A server that never ends an event (no blank line) cannot make the client hold it all."""
    p = SseParser()
    with pytest.raises(MalformedStreamError, match="without an end"):
        for _ in range(MAX_EVENT_BYTES // 65536 + 2):
            p.feed(b"data: " + b"x" * 65530)
    assert len(p.leftover) <= MAX_EVENT_BYTES + 65536


def test_a_servers_error_message_is_kept_short() -> None:
    ev = SseParser().feed(_chunk({"error": {"message": "boom " * 100_000}}))
    assert ev.error is not None and len(ev.error) < 400


def test_record_properties_and_jsonl_round_trip(tmp_path: Path) -> None:
    r = RequestRecord(request_id="r1", chunk_offsets_ms=[50.0, 60.0, 75.0], cached_tokens=None)
    assert (r.ttft_ms, r.e2el_ms, r.itls_ms, r.ok) == (50.0, 75.0, [10.0, 15.0], True)
    path = tmp_path / "records.jsonl"
    with JsonlWriter(path) as w:
        w.write_record(r)
    with path.open("a") as fh:
        fh.write('{"request_id": "torn", "chunk_off')  # a crash mid-line
    back = read_records(path)
    assert back == [r]
    assert RequestRecord.from_dict({"request_id": "x", "future_field": 1}).request_id == "x"
