"""Reading what `kvops advise` replays: every trace form, malformed lines by number, --strict,
ab-test records, and the hash-id prompts' prefix sharing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from kvops.advise.trace import ReadOptions, TraceError, load_workload, read_lines, word_tokenizer
from kvops.advise.workload import PromptBuilder, TraceRequest, Workload, measure_reuse
from kvops.cli import main
from kvops.sim.hashing import prefix_hashes
from kvops.workload.record import RequestRecord

VOCAB = 128_256
TOKENIZE = word_tokenizer(VOCAB)


def _read(lines: list[str], **kw: Any) -> Workload:
    return read_lines(lines, "t.jsonl", ReadOptions(**kw), TOKENIZE)


def test_every_prompt_form_and_arrival_unit() -> None:
    lines = [
        json.dumps({"arrival_s": 1.5, "prompt_token_ids": [5, 6, 7], "output_tokens": 4}),
        json.dumps({"timestamp": 500, "prompt": "one two three four", "max_tokens": 2}),
        json.dumps(
            {"timestamp": 2000, "input_length": 700, "output_length": 9, "hash_ids": [1, 2]}
        ),
    ]
    w = read_lines(lines, "t.jsonl", ReadOptions(), TOKENIZE, "words counted as tokens")
    reqs = list(w.requests())
    # Sorted by arrival and shifted so the first arrives at 0 (timestamps are milliseconds).
    assert [r.line for r in reqs] == [2, 1, 3]
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 1.5]
    assert [r.prompt_len for r in reqs] == [4, 3, 700]
    assert [r.output_tokens for r in reqs] == [2, 4, 9]
    assert reqs[2].hash_ids == (1, 2)
    assert w.notes == ["words counted as tokens"]  # a text prompt was read: the note applies


def test_malformed_lines_are_reported_by_number_and_skipped() -> None:
    good = json.dumps({"prompt_token_ids": [1, 2], "output_tokens": 3})
    lines = [
        good,
        "{not json",
        json.dumps({"prompt_token_ids": [1, 2]}),  # no output length
        json.dumps({"prompt_token_ids": [], "output_tokens": 1}),
        json.dumps({"hash_ids": [1, 2, 3], "input_length": 600, "output_tokens": 1}),
        "",
        json.dumps([1, 2]),
        json.dumps({"prompt_token_ids": [1], "output_tokens": 1, "arrival_s": -1}),
        good,
    ]
    w = _read(lines)
    assert w.num_requests == 2
    skipped = w.skipped_lines
    assert [s.split(":")[1] for s in skipped] == ["2", "3", "4", "5", "7", "8"]
    assert "not JSON" in skipped[0]
    assert "no output length" in skipped[1]
    assert "do not fit input_length 600" in skipped[3]


def test_strict_fails_on_the_first_bad_line_naming_it() -> None:
    lines = [json.dumps({"prompt_token_ids": [1], "output_tokens": 1}), "oops"]
    with pytest.raises(TraceError, match=r"t.jsonl:2: not JSON .*--strict"):
        _read(lines, strict=True)


def test_default_output_tokens_fills_missing_lengths() -> None:
    w = _read([json.dumps({"prompt_token_ids": [1, 2]})], default_output_tokens=7)
    assert next(w.requests()).output_tokens == 7


def test_nothing_usable_is_an_error() -> None:
    with pytest.raises(TraceError, match="no requests to replay; 1 malformed"):
        _read(["[]"])


def test_hash_ids_share_exactly_their_common_blocks() -> None:
    builder = PromptBuilder(VOCAB, 512)
    a = builder.tokens(TraceRequest(0, 1300, 1, hash_ids=(7, 8, 9), line=1))
    b = builder.tokens(TraceRequest(0, 1536, 1, hash_ids=(7, 8, 10), line=2))
    c = builder.tokens(TraceRequest(0, 2000, 1, hash_ids=(7,), line=3))
    assert a.shape == (1300,) and b.shape == (1536,) and c.shape == (2000,)
    assert np.array_equal(a[:1024], b[:1024]) and not np.array_equal(a[1024:1300], b[1024:1300])
    assert np.array_equal(a[:512], c[:512])
    assert (a >= 16).all() and (a < VOCAB).all()
    # The model's own block hashes agree: 64 shared 16-token blocks, then different.
    ha, _ = prefix_hashes(a, 16, 256)
    hb, _ = prefix_hashes(b, 16, 256)
    common = next(i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y)
    assert common == 64


def test_reuse_counts_repeated_prefix_chunks() -> None:
    lines = [
        json.dumps(
            {"arrival_s": i, "input_length": 1024, "output_tokens": 1, "hash_ids": [1, 2 + i]}
        )
        for i in range(4)
    ]
    w = _read(lines)
    reuse = measure_reuse(w, PromptBuilder(VOCAB, 512), 256)
    # Block 1 (512 tokens = 2 chunks) is shared by all 4 requests; the first sees it new.
    assert reuse.prompt_tokens == 4096
    assert reuse.reusable_tokens == 3 * 512
    assert reuse.shared_working_set_tokens == 512
    assert reuse.distinct_shared_prefixes == 1
    assert reuse.typical_shared_prefix_tokens == 512


def _records(tmp_path: Path) -> Path:
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "multi.yaml").write_text(
        "name: multi\nnum_prefixes: 2\nprefix_tokens: 1024\nprompt_tokens: 1200\n"
        "output_tokens: 8\nbatch_size: 4\n"
    )
    lines = []
    for arm in ("baseline", "offload"):
        for j in range(4):
            record = RequestRecord(
                request_id=f"{arm}-{j}",
                arm=arm,
                scenario="multi",
                prefix_id=j % 2,
                send_perf_s=100.0 + j,
                chunk_offsets_ms=[5.0],
                prompt_tokens=1200,
                output_tokens=8,
            )
            lines.append(record.to_json())  # exactly what ab-test writes
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_abtest_records_replay_one_arm_with_prefixes_from_the_run(tmp_path: Path) -> None:
    path = _records(tmp_path)
    w = load_workload(str(path), ReadOptions(), VOCAB, "none/none")
    reqs = list(w.requests())
    assert w.kind == "records" and len(reqs) == 4
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0, 3.0]
    assert reqs[0].hash_ids == reqs[2].hash_ids and reqs[0].hash_ids != reqs[1].hash_ids
    assert len(reqs[0].hash_ids or ()) == 2  # 1024-token prefix = two 512-token blocks
    assert "arm 'baseline'" in w.notes[0]


def test_presets_and_missing_files(tmp_path: Path) -> None:
    w = load_workload("single-shared-prefix", ReadOptions(), VOCAB, "x")
    assert w.kind == "spec" and w.num_requests == 160
    assert all(g.closed for g in w.groups)
    with pytest.raises(TraceError, match=r"no such file.*multi-shared-prefix"):
        load_workload(str(tmp_path / "nope.jsonl"), ReadOptions(), VOCAB, "x")
    bad = tmp_path / "bad.yaml"
    bad.write_text("prefix_token: 3\n")
    with pytest.raises(TraceError, match="unknown key"):
        load_workload(str(bad), ReadOptions(), VOCAB, "x")


def test_cli_reports_skipped_lines_and_strict_exit_2(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    good = {"input_length": 600, "output_tokens": 4, "hash_ids": [1], "arrival_s": 0}
    trace.write_text(
        json.dumps(good) + "\nnot json\n" + json.dumps({**good, "arrival_s": 1}) + "\n"
    )
    result = CliRunner().invoke(main, ["advise", str(trace), "--quick", "--json"])
    assert result.exit_code == 0, result.output
    assert "warning: skipped" in result.stderr and ":2: not JSON" in result.stderr
    data = json.loads(result.stdout)
    assert data["requests"] == 2 and len(data["skipped_lines"]) == 1
    strict = CliRunner().invoke(main, ["advise", str(trace), "--strict"])
    assert strict.exit_code == 2
    assert ":2: not JSON" in strict.output and "Traceback" not in strict.output


def test_cli_unknown_profile_and_missing_trace_are_usage_errors(tmp_path: Path) -> None:
    unknown = CliRunner().invoke(main, ["advise", "unique-one-shot", "--storage", "nas"])
    assert unknown.exit_code == 2 and "ontap-nfs-rdma-200g" in unknown.output
    missing = CliRunner().invoke(main, ["advise", str(tmp_path / "x.jsonl")])
    assert missing.exit_code == 2 and "no such file" in missing.output
    assert missing.exception is None or isinstance(missing.exception, SystemExit)


def test_requests_beyond_the_context_are_refused_without_building_them(tmp_path: Path) -> None:
    huge = {"input_length": 10**12, "output_tokens": 3, "hash_ids": [1]}
    ok = {"input_length": 1000, "output_tokens": 3, "hash_ids": [1]}
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(ok) + "\n" + json.dumps(huge) + "\n")
    result = CliRunner().invoke(main, ["advise", str(trace), "--quick", "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.stdout)["notes"]
    assert any("line 2: 1000000000000 prompt" in n and "131072" in n for n in notes)
    trace.write_text(json.dumps(huge) + "\n[[[" + "[" * 100_000 + "\n")
    result = CliRunner().invoke(main, ["advise", str(trace), "--quick"])
    assert result.exit_code == 2
    assert "no request of the workload could be simulated" in result.output
    assert "nested too deeply" in result.stderr


def test_text_uses_the_models_tokenizer_when_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvops.advise.trace as trace_mod

    def by_character(_hf_name: str) -> Any:
        return lambda text: [ord(c) for c in text]

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"prompt": "four words of text", "output_tokens": 2}) + "\n")
    words = load_workload(str(trace), ReadOptions(), VOCAB, "meta-llama/Llama-3.1-8B-Instruct")
    assert next(words.requests()).prompt_len == 4
    assert "one token" in words.notes[0] and "Llama-3.1-8B-Instruct" in words.notes[0]
    monkeypatch.setattr(trace_mod, "model_tokenizer", by_character)
    chars = load_workload(str(trace), ReadOptions(), VOCAB, "meta-llama/Llama-3.1-8B-Instruct")
    assert next(chars.requests()).prompt_len == len("four words of text")
    assert not any("one token" in note for note in chars.notes)
