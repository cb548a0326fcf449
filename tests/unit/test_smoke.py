"""The pure smoke judge: each piece of evidence gives the status and reason an operator expects."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvops.checks import CATALOG, Finding, Severity
from kvops.checks.model import finding
from kvops.report.findings import to_junit
from kvops.smoke.judge import (
    EXTERNAL_HITS,
    EXTERNAL_QUERIES,
    LMCACHE_HIT,
    LMCACHE_STORED,
    LOCAL_HITS,
    ChunkFile,
    Eviction,
    MetricsSnapshot,
    RequestResult,
    ServiceLog,
    SmokeEvidence,
    as_fleet,
    exit_code,
    item_name,
    judge,
    overall,
    report_dict,
)
from kvops.smoke.kv_check import Completion, KvCheck, parse_completion

PROMPT = 2048
TOKENS = tuple(f"token_id:{t}" for t in (17, 4, 933, 12, 12, 5, 88, 301))
LOGPROBS = (-0.12, -1.5, -0.03, -2.2, -0.7, -0.01, -3.1, -0.4)


def kv_check(
    tokens: tuple[str, ...] = TOKENS,
    logprobs: tuple[float | None, ...] = LOGPROBS,
    cached: int | None = 1792,
) -> KvCheck:
    """The correctness prompt: computed from scratch, then re-sent with `tokens`/`logprobs`."""
    return KvCheck(PROMPT, Completion(TOKENS, LOGPROBS, 0), Completion(tokens, logprobs, cached))


def snap(has_lmcache: bool = False, **values: float | None) -> MetricsSnapshot:
    names = {
        "stored": LMCACHE_STORED,
        "hit": LMCACHE_HIT,
        "ext_q": EXTERNAL_QUERIES,
        "ext_h": EXTERNAL_HITS,
        "local_h": LOCAL_HITS,
    }
    return MetricsSnapshot({names[k]: v for k, v in values.items()}, has_lmcache)


def connector_evidence(**over: object) -> SmokeEvidence:
    """A vLLM with the ExampleConnector that did everything right."""
    ev = SmokeEvidence(
        url="http://127.0.0.1:8000",
        model="tiny",
        prompt_tokens=PROMPT,
        seed=7,
        before=snap(ext_q=0, ext_h=0, local_h=0),
        after_first=snap(ext_q=PROMPT, ext_h=0, local_h=0),
        before_resend=snap(ext_q=PROMPT, ext_h=0, local_h=0),
        after_resend=snap(ext_q=2 * PROMPT, ext_h=1920, local_h=0),
        first_sends=(RequestResult(ttft_ms=260.0, prompt_tokens=PROMPT, cached_tokens=0),),
        resends=(RequestResult(ttft_ms=60.0, prompt_tokens=PROMPT, cached_tokens=1920),),
        eviction=Eviction("reset_prefix_cache", "POST /reset_prefix_cache answered success"),
        gds_dir="/data/kv",
        files_before_count=0,
        files_after_count=1,
        new_files=(ChunkFile("/data/kv/abc/layer0.safetensors", 1 << 20, "connector"),),
        kv_check=kv_check(),
    )
    return dataclasses.replace(ev, **over)  # type: ignore[arg-type]


def lmcache_evidence(**over: object) -> SmokeEvidence:
    ev = connector_evidence(
        before=snap(True, stored=0, hit=0, ext_q=0, ext_h=0, local_h=0),
        after_first=snap(True, stored=2048, hit=0, ext_q=PROMPT, ext_h=0, local_h=0),
        before_resend=snap(True, stored=2048, hit=0, ext_q=PROMPT, ext_h=0, local_h=0),
        after_resend=snap(True, stored=2048, hit=2048, ext_q=2 * PROMPT, ext_h=2047, local_h=0),
        new_files=tuple(
            ChunkFile(
                f"/data/kv/12/34/tiny%401%400%40{i:x}%40float.kvcache.safetensors",
                4096 + 65536,
                "lmcache",
                True,
            )
            for i in range(8)
        ),
        service_log=ServiceLog("vllm.log", 1200, ()),
    )
    return dataclasses.replace(ev, **over)  # type: ignore[arg-type]


def by_name(items: list[Finding]) -> dict[str, Finding]:
    return {item_name(i): i for i in items}


def test_connector_engine_passes_and_lmcache_items_skip_with_reason() -> None:
    items = by_name(judge(connector_evidence()))
    assert items["offload"].severity == "PASS"
    assert items["stored_tokens"].severity == "SKIP"
    assert items["stored_tokens"].message == "no LMCache metrics: not an LMCache engine"
    assert items["retrieved_tokens"].severity == "SKIP"
    assert items["external_hits"].severity == "PASS"
    assert "1,920 tokens" in items["external_hits"].message
    assert items["ttft"].severity == "PASS"
    assert items["chunk_files"].severity == "PASS"
    assert "connector files" in items["chunk_files"].message
    assert overall(list(items.values())) == "PASS"
    assert exit_code(list(items.values())) == 0


def test_lmcache_engine_passes_every_item() -> None:
    items = judge(lmcache_evidence())
    assert [i.severity for i in items] == ["PASS"] * 9
    named = by_name(items)
    assert "LMCache chunk files" in named["chunk_files"].message
    assert "2,048 tokens" in named["stored_tokens"].message
    # its counter rose for the correctness prompt too, and the message says so
    assert named["stored_tokens"].message.endswith("prompt and the correctness prompt")


def test_engine_without_offload_fails_with_offload_not_configured() -> None:
    flat = snap(ext_q=0, ext_h=0, local_h=0)
    ev = connector_evidence(
        before=flat,
        after_first=flat,
        before_resend=flat,
        after_resend=flat,
        resends=(RequestResult(ttft_ms=255.0, prompt_tokens=PROMPT, cached_tokens=0),),
        new_files=(),
    )
    items = judge(ev)
    named = by_name(items)
    assert named["offload"].severity == "FAIL"
    assert named["offload"].message.startswith("offload not configured")
    assert named["external_hits"].severity == "FAIL"
    assert named["ttft"].severity == "FAIL"
    assert named["chunk_files"].severity == "FAIL"
    assert exit_code(items) == 1


def test_missing_external_metric_is_offload_not_configured_and_hits_skip() -> None:
    bare = MetricsSnapshot({}, False)
    ev = connector_evidence(before=bare, after_first=bare, before_resend=bare, after_resend=bare)
    named = by_name(judge(ev))
    assert named["offload"].severity == "FAIL"
    assert "no vllm:external_prefix_cache_queries metric" in named["offload"].message
    assert named["external_hits"].severity == "SKIP"


def test_prompt_still_resident_fails_eviction() -> None:
    # both re-sent prompts (the test prompt and the correctness prompt) found in the GPU cache
    ev = connector_evidence(after_resend=snap(ext_q=2 * PROMPT, ext_h=0, local_h=2 * 1920))
    named = by_name(judge(ev))
    assert named["eviction"].severity == "FAIL"
    assert "still in GPU memory" in named["eviction"].message


def test_no_way_to_evict_fails_eviction_with_the_reason() -> None:
    ev = connector_evidence(eviction=Eviction("none", "no /reset_prefix_cache and no KV capacity"))
    named = by_name(judge(ev))
    assert named["eviction"].severity == "FAIL"
    assert "no /reset_prefix_cache" in named["eviction"].message


@pytest.mark.parametrize(
    ("resend_ms", "status"), [(60.0, "PASS"), (207.0, "PASS"), (209.0, "FAIL"), (300.0, "FAIL")]
)
def test_ttft_needs_a_clear_drop(resend_ms: float, status: str) -> None:
    ev = connector_evidence(resends=(RequestResult(resend_ms, PROMPT, 0),))
    assert by_name(judge(ev))["ttft"].severity == status


def test_ttft_message_reads_plainly() -> None:
    item = by_name(judge(connector_evidence()))["ttft"]
    assert item.message == (
        "median TTFT 260.0 ms cold → 60.0 ms re-sent (77% lower; needed ≥ 20% lower)"
    )
    slow = connector_evidence(resends=(RequestResult(286.0, PROMPT, 0),))
    slower = by_name(judge(slow))["ttft"]
    assert "(10% higher;" in slower.message


def test_chunk_sizes_are_human_readable() -> None:
    item = by_name(judge(connector_evidence()))["chunk_files"]
    assert "1.0 MiB" in item.message
    small = (ChunkFile("/data/kv/a.safetensors", 3000, "connector"),)
    assert "2.9 KiB" in by_name(judge(connector_evidence(new_files=small)))["chunk_files"].message


def test_ttft_is_judged_on_medians_so_one_slow_request_cannot_decide() -> None:
    cold = tuple(RequestResult(ms, PROMPT, 0) for ms in (150.0, 900.0, 160.0))  # one delayed
    warm = tuple(RequestResult(ms, PROMPT, 0) for ms in (155.0, 149.0, 158.0))  # no offload
    ev = connector_evidence(first_sends=cold, resends=warm)
    item = by_name(judge(ev))["ttft"]
    assert item.severity == "FAIL"
    assert "160.0 ms cold → 155.0 ms" in item.message
    assert (
        "3 x 2,048-token prompts"
        in by_name(judge(lmcache_evidence(first_sends=cold)))["stored_tokens"].message
    )


def test_ttft_margin_is_configurable() -> None:
    ev = connector_evidence(resends=(RequestResult(200.0, PROMPT, 0),))
    assert by_name(judge(ev, min_ttft_drop=0.5))["ttft"].severity == "FAIL"
    assert by_name(judge(ev, min_ttft_drop=0.1))["ttft"].severity == "PASS"


def test_chunk_files_skip_without_dir_and_fail_without_new_files() -> None:
    assert by_name(judge(connector_evidence(gds_dir=None)))["chunk_files"].severity == "SKIP"
    ev = connector_evidence(files_before_count=3, files_after_count=3, new_files=())
    item = by_name(judge(ev))["chunk_files"]
    assert item.severity == "FAIL"
    assert "none new" in item.message


def test_bad_lmcache_header_fails_chunk_files() -> None:
    bad = (ChunkFile("/data/kv/12/34/k.kvcache.safetensors", 100, "lmcache", False),)
    item = by_name(judge(lmcache_evidence(new_files=bad)))["chunk_files"]
    assert item.severity == "FAIL"
    assert "bad header" in item.message


def test_lmcache_counters_that_did_not_rise_fail() -> None:
    still = snap(True, stored=0, hit=0, ext_q=PROMPT, ext_h=0, local_h=0)
    named = by_name(
        judge(lmcache_evidence(after_first=still, before_resend=still, after_resend=still))
    )
    assert named["stored_tokens"].severity == "FAIL"
    assert named["retrieved_tokens"].severity == "FAIL"
    assert named["offload"].severity == "PASS"  # LMCache is there, it just did nothing


def test_evidence_round_trips_through_json() -> None:
    ev = lmcache_evidence()
    again = SmokeEvidence.from_dict(json.loads(json.dumps(ev.to_dict())))
    assert judge(again) == judge(ev)


def test_overall_of_only_skips_is_skip() -> None:
    assert overall([finding("GDS-206", Severity.SKIP, "x")]) == "SKIP"
    assert exit_code([finding("GDS-206", Severity.SKIP, "x")]) == 0


def test_every_item_is_a_catalog_finding_with_a_remedy_when_it_fails() -> None:
    flat = snap(ext_q=0, ext_h=0, local_h=0)
    failed = judge(
        connector_evidence(
            after_resend=flat,
            new_files=(),
            kv_check=kv_check(tokens=(*TOKENS[:3], "token_id:5", *TOKENS[4:])),
            service_log=ServiceLog("vllm.log", 10, ("LMCache ERROR: ... degraded mode",)),
        )
    )
    for item in judge(lmcache_evidence()) + failed:
        info = CATALOG[item.check_id]
        assert info.concern == "smoke" and item.title == info.title
        assert bool(item.remedy) == (item.severity is Severity.FAIL)
    assert sorted(i.check_id for i in failed) == [f"GDS-20{n}" for n in range(9)]


def test_smoke_reports_in_validates_shapes() -> None:
    ev = connector_evidence(new_files=())
    items = judge(ev)
    doc = {**as_fleet(ev.url, items).to_dict(), **report_dict(ev, items)}
    assert doc["exit_code"] == 1 and doc["status"] == "FAIL"
    host = doc["hosts"][ev.url]
    assert host["status"] == "FAIL"
    assert {f["check_id"]: f["severity"] for f in host["findings"]}["GDS-206"] == "FAIL"
    assert doc["items"][8] == {
        "name": "chunk_files",
        "status": "FAIL",
        "message": by_name(items)["chunk_files"].message,
    }
    assert SmokeEvidence.from_dict(doc["evidence"]) == ev
    junit = to_junit(as_fleet(ev.url, items), suite_name="kvops-smoke")
    assert 'name="GDS-206 New chunk files in the storage directory"' in junit
    assert junit.count("<failure") == 1 and junit.count("<skipped") == 3


def test_offloaded_kv_that_changes_a_greedy_token_fails_naming_the_first_difference() -> None:
    wrong = (*TOKENS[:2], "token_id:934", *TOKENS[3:])
    logprobs = (*LOGPROBS[:2], -1.9, *LOGPROBS[3:])
    item = by_name(judge(lmcache_evidence(kv_check=kv_check(wrong, logprobs))))["kv_correct"]
    assert item.severity == "FAIL"
    assert item.check_id == "GDS-207"
    assert (
        "token 3 differs: recomputed id 933 (logprob -0.03000), from offload id 934 "
        "(logprob -1.90000)" in item.message
    )
    assert "1,792 tokens of 2,048 cached" in item.message
    assert "gds_path" in item.remedy


@pytest.mark.parametrize(
    ("shift", "tolerance", "status"),
    [(0.00002, 0.05, "PASS"), (0.049, 0.05, "PASS"), (0.06, 0.05, "FAIL"), (0.02, 0.01, "FAIL")],
)
def test_logprobs_must_agree_within_the_tolerance(
    shift: float, tolerance: float, status: str
) -> None:
    moved = tuple(x - shift if i == 4 else x for i, x in enumerate(LOGPROBS))
    ev = lmcache_evidence(kv_check=kv_check(logprobs=moved))
    item = by_name(judge(ev, logprob_tolerance=tolerance))["kv_correct"]
    assert item.severity == status, item.message
    if status == "FAIL":
        assert "logprob 5 differs" in item.message
        assert "id 12 (logprob -0.70000), from offload id 12" in item.message
    else:
        assert "8 greedy tokens identical" in item.message


def test_kv_check_skips_without_logprobs_or_without_offloaded_kv() -> None:
    bare = KvCheck(PROMPT, Completion((), (), 0), Completion((), (), 1792))
    item = by_name(judge(lmcache_evidence(kv_check=bare)))["kv_correct"]
    assert (item.severity, item.message) == (
        "SKIP",
        "the server answered without logprobs: cannot compare greedy answers",
    )
    item = by_name(judge(lmcache_evidence(kv_check=kv_check(cached=0))))["kv_correct"]
    assert item.severity == "SKIP" and "recomputed (0 cached tokens)" in item.message
    # a shorter answer differs where it ends
    short = kv_check(tokens=TOKENS[:6], logprobs=LOGPROBS[:6])
    item = by_name(judge(lmcache_evidence(kv_check=short)))["kv_correct"]
    assert item.severity == "FAIL" and "from offload (no token: the answer ended)" in item.message


def test_degraded_mode_in_the_service_log_fails_smoke_with_the_lines() -> None:
    lines = (
        "LMCache ERROR: Failed to initialize LMCacheManager components: RuntimeError: No "
        "supported cpu connector found. System will operate in degraded mode (recompute).",
    )
    item = by_name(judge(lmcache_evidence(service_log=ServiceLog("vllm.log", 900, lines))))[
        "service_log"
    ]
    assert item.severity == "FAIL" and item.check_id == "GDS-208"
    assert item.message.startswith(
        "vllm.log: 1x 'Failed to initialize LMCacheManager components': LMCache failed"
    )
    assert "1x 'degraded mode'" in item.message
    assert "No supported cpu connector found" in item.message and lines[0] in item.evidence
    assert "first LMCache ERROR of this start" in item.remedy
    clean = by_name(judge(lmcache_evidence()))["service_log"]
    assert clean.message == "vllm.log: 1,200 lines, no LMCache fallback or ignored setting"
    none = by_name(judge(connector_evidence()))["service_log"]
    assert none.severity == "SKIP" and "no --service-log given" in none.message


def test_evidence_saved_before_the_kv_check_still_loads() -> None:
    doc = lmcache_evidence().to_dict()
    del doc["kv_check"], doc["service_log"]
    named = by_name(judge(SmokeEvidence.from_dict(doc)))
    assert named["kv_correct"].severity == "SKIP"
    assert named["service_log"].severity == "SKIP"


def test_a_vllm_completion_with_logprobs_parses_to_tokens_and_logprobs() -> None:
    """The shape of vLLM's non-streaming /v1/completions answer with `logprobs: 1` and
    `return_tokens_as_token_ids` (vllm/entrypoints/openai/protocol.py CompletionLogProbs)."""
    doc = {
        "id": "cmpl-1",
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "logprobs": {
                    "text_offset": [0, 1],
                    "token_logprobs": [-0.25, float("-inf")],
                    "tokens": ["token_id:7", "token_id:9"],
                    "top_logprobs": [{"token_id:7": -0.25}, {"token_id:9": -1.0}],
                },
            }
        ],
        "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}},
    }
    got = parse_completion(doc)
    assert got == Completion(("token_id:7", "token_id:9"), (-0.25, None), 4)
    no_logprobs = {"choices": [{"text": "ab", "logprobs": None}], "usage": {}}
    assert parse_completion(no_logprobs) == Completion((), (), None)
    with pytest.raises(ValueError, match="no choices"):
        parse_completion({"error": "x"})


def test_failed_loads_in_the_service_log_fail_smoke_though_every_request_was_answered() -> None:
    """LMCache's adapter logs a load that came back short (vllm_v1_adapter.py); with
    kv_load_failure_policy recompute vLLM answered anyway, so only the log tells."""
    lines = (
        "[2026-12-04 18:40:01] LMCache ERROR: Request cmpl-1-0The number of retrieved tokens is "
        "less than the expected number of tokens! This should not happen! (vllm_v1_adapter.py)",
        "[2026-12-04 18:40:01] LMCache ERROR: GDS read failed for /data/kv/12/34/x: [Errno 2]",
    )
    ev = lmcache_evidence(service_log=ServiceLog("vllm.log", 900, lines))
    item = by_name(judge(ev))["service_log"]
    assert item.severity == "FAIL"
    assert "a KV load from the offload tier failed and vLLM recomputed those tokens" in (
        item.message
    )
    assert "a chunk file could not be read from gds_path" in item.message


def test_a_service_log_that_could_not_be_read_skips_with_the_reason() -> None:
    log = ServiceLog("gpu1: journal of vllm.service", 0, error="journal not read: exit 1")
    item = by_name(judge(lmcache_evidence(service_log=log)))["service_log"]
    assert (item.severity, item.message) == (
        "SKIP",
        "gpu1: journal of vllm.service: journal not read: exit 1",
    )
    again = SmokeEvidence.from_dict(
        json.loads(json.dumps(lmcache_evidence(service_log=log).to_dict()))
    )
    assert again.service_log == log


def test_kv_check_cannot_pass_when_its_reference_came_from_a_warm_store() -> None:
    # the same --seed on a store an earlier run filled: the "cold" answer was loaded too
    warm = KvCheck(PROMPT, Completion(TOKENS, LOGPROBS, 1792), Completion(TOKENS, LOGPROBS, 1792))
    item = by_name(judge(lmcache_evidence(kv_check=warm)))["kv_correct"]
    assert item.severity == "SKIP" and "not computed from scratch" in item.message


# How `lmcache server`'s fs L2 adapter names an object (LMCache 0.5.6,
# lmcache/v1/distributed/l2_adapters/fs_l2_adapter.py `_object_key_to_filename`):
# <model, "/" as -SEP->@0x<kv_rank, 8 hex digits>@<object group hex>@<chunk hash hex>.data
FS_OBJECT = "-SEP-models-SEP-tiny@0x01000100@0@9f3ac1d2e4b5a6978877665544332211.data"


def test_the_server_file_tiers_objects_are_chunk_files(tmp_path: Path) -> None:
    from kvops.smoke import chunk_files

    (tmp_path / FS_OBJECT).write_bytes(b"\0" * 4096)
    (tmp_path / "empty@0x01000100@0@00ff.data").write_bytes(b"")
    (tmp_path / FS_OBJECT.replace(".data", ".tmp")).write_bytes(b"\0")  # a write in flight
    (tmp_path / "notes.data").write_text("not LMCache's")
    paths = chunk_files.list_paths(str(tmp_path))
    assert [Path(p).name for p in paths] == [FS_OBJECT, "empty@0x01000100@0@00ff.data"]
    described = {Path(p).name: chunk_files.describe(p) for p in paths}
    assert described[FS_OBJECT]["layout"] == "lmcache-fs"
    assert described[FS_OBJECT]["header_ok"] is True
    assert described["empty@0x01000100@0@00ff.data"]["header_ok"] is False

    good = (ChunkFile(str(tmp_path / FS_OBJECT), 4096, "lmcache-fs", True),)
    item = by_name(judge(lmcache_evidence(new_files=good)))["chunk_files"]
    assert item.severity == "PASS" and "fs L2 adapter" in item.message, item.message
    empty = (ChunkFile(str(tmp_path / "e@0x01000100@0@00ff.data"), 0, "lmcache-fs", False),)
    assert by_name(judge(lmcache_evidence(new_files=empty)))["chunk_files"].severity == "FAIL"
