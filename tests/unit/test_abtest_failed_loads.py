"""Failed KV loads per segment and arm: read from the engines' log lines (in the words of vLLM's
scheduler and LMCache 0.5.6, `kvops.parse.kv_load_failures`) and LMCache's failed-get counter,
summed over the counted segments, kept in results.json (an old document without them still
loads) and said beside the verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvops.abtest.engine_counters import read_counters
from kvops.abtest.failed_loads import (
    FailedLoads,
    failed_load_warnings,
    failed_loads_by_arm,
    log_size,
    read_log_since,
)
from kvops.abtest.result_types import RunResults
from kvops.parse.kv_load_failures import scan_lines
from kvops.report.abtest_files import markdown

pytestmark = pytest.mark.unit
FIXTURES = Path(__file__).parent.parent / "fixtures" / "abtest"

# Line shapes as the engines print them: vLLM's logger prefix (vllm/logger.py) and LMCache's
# (lmcache/logging.py), messages from vllm/v1/core/sched/scheduler.py, LMCache 0.5.6
# gds_backend.py and vllm_v1_adapter.py.
RECOVERED = (
    "(EngineCore pid=16405) WARNING 12-05 09:07:13 [scheduler.py:3426] Recovered from KV load "
    "failure: 2 request(s) rescheduled (768 tokens affected)."
)
READ_FAILED = (
    "\x1b[31;20m[2026-12-05 09:07:13,100] LMCache ERROR:\x1b[0m GDS read failed for "
    "/mnt/kv/12/34/m%401%400%40ab%40float.kvcache.safetensors: [Errno 2] No such file or "
    "directory (gds_backend.py:1149:lmcache.v1.storage_backend.gds_backend)"
)
SHORT = (
    "[2026-12-05 09:07:13,101] LMCache ERROR: Request cmpl-1The number of retrieved tokens is "
    "less than the expected number of tokens! This should not happen! (vllm_v1_adapter.py:877)"
)
FAILED = (
    "(EngineCore pid=1) ERROR 12-05 09:07:13 [scheduler.py:3417] Failing 1 request(s) due to KV "
    "load failure (failure_policy=fail, 256 tokens affected). Request IDs: {'cmpl-2'}"
)
HEALTHY = "[2026-12-05 09:05:43,916] LMCache INFO: Retrieved 1536 out of 1536 required tokens"


def test_the_engines_lines_are_counted_by_what_they_say() -> None:
    found = scan_lines([HEALTHY, RECOVERED, READ_FAILED, READ_FAILED, SHORT, FAILED, HEALTHY])
    assert (found.requests_recomputed, found.tokens_recomputed) == (2, 768)
    assert (found.requests_failed, found.lmcache_read_errors) == (1, 2)
    assert found.lmcache_short_retrieves == 1 and found.lines == 7
    assert found.examples == [RECOVERED, READ_FAILED.strip(), READ_FAILED.strip()]
    assert not scan_lines([HEALTHY] * 3).any


def test_a_segment_reads_only_the_lines_written_since_its_start(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    assert log_size(log) == 0  # not written yet: read from the start
    log.write_text(RECOVERED + "\n")
    start = log_size(log)
    with log.open("a") as fh:
        fh.write(HEALTHY + "\n" + READ_FAILED + "\n")
    seg = read_log_since(log, start)
    assert seg["path"] == str(log) and seg["lines"] == 2
    assert seg["requests_recomputed"] == 0 and seg["lmcache_read_errors"] == 1
    # ANSI colour codes are gone from what is quoted
    assert seg["examples"] == [READ_FAILED.replace("\x1b[31;20m", "").replace("\x1b[0m", "")]
    end = log_size(log)
    log.write_text(SHORT + "\n")  # a restarted engine's new, shorter log: read whole
    assert log_size(log) < end
    assert read_log_since(log, end)["lmcache_short_retrieves"] == 1
    assert "error" in read_log_since(tmp_path / "gone.log", 0)


def _seg(trial: int, arm: str, attempt: str = "a0-", **extra: object) -> dict[str, object]:
    return {"scenario": "s", "trial": trial, "arm": arm, "attempt": attempt, **extra}


def _log(**counts: int) -> dict[str, object]:
    return {"path": "/var/log/vllm.log", "examples": ["x"], **counts}


def test_segments_sum_per_arm_and_keep_each_trial() -> None:
    done = {("s", 0, "offload"): "a0-", ("s", 1, "offload"): "a1-", ("s", 0, "base"): "a0-"}
    segments = [
        _seg(0, "offload", service_log=_log(requests_recomputed=0, lmcache_read_errors=0)),
        _seg(1, "offload", "a0-", service_log=_log(requests_recomputed=9)),  # superseded attempt
        _seg(1, "offload", "a1-", service_log=_log(requests_recomputed=3, tokens_recomputed=900,
                                                   lmcache_read_errors=7)),
        _seg(0, "base", engine_counters={"prompt_tokens": 10.0}),  # no log, no failed-get counter
    ]  # fmt: skip
    out = failed_loads_by_arm(segments, done)
    assert set(out) == {("s", "offload")}  # the baseline reported nothing: absent, not zero
    fl = out[("s", "offload")]
    assert (fl.failed_loads, fl.requests_recomputed, fl.tokens_recomputed) == (3, 3, 900)
    assert fl.lmcache_read_errors == 7 and fl.lmcache_failed_gets is None
    assert fl.per_trial == [{"trial": 0, "failed_loads": 0}, {"trial": 1, "failed_loads": 3}]
    assert fl.sources == ["service log /var/log/vllm.log"]
    [warning] = failed_load_warnings(out)
    assert warning.startswith("s: arm offload had at least 3 failed KV load(s) (vLLM rescheduled")
    assert "verdict include loads that were recomputed" in warning


def test_lmcaches_failed_get_counter_counts_without_a_log() -> None:
    text = (
        "# TYPE lmcache:get_blocking_failed_count gauge\n"
        'lmcache:get_blocking_failed_count{model_name="m",worker_id="0"} 4.0\n'
    )
    assert read_counters(text)["lmcache_get_failed"] == 4.0
    segments = [_seg(0, "offload", engine_counters={"lmcache_get_failed": 4.0})]
    fl = failed_loads_by_arm(segments, {("s", 0, "offload"): "a0-"})[("s", "offload")]
    assert fl.failed_loads == 4 and fl.sources == ["lmcache:get_blocking_failed_count"]
    assert fl.requests_recomputed is None  # no log read: not reported


def test_unreadable_chunk_files_alone_still_count_a_failed_load() -> None:
    segments = [_seg(0, "offload", service_log=_log(lmcache_read_errors=5))]
    fl = failed_loads_by_arm(segments, {("s", 0, "offload"): "a0-"})[("s", "offload")]
    assert fl.failed_loads == 1  # five files, at least one load


def test_none_failed_gives_no_warning_and_an_unreadable_log_is_said() -> None:
    done = {("s", 0, "offload"): "a0-"}
    clean = failed_loads_by_arm([_seg(0, "offload", service_log=_log())], done)
    assert clean[("s", "offload")].failed_loads == 0 and failed_load_warnings(clean) == []
    broken = [_seg(0, "offload", service_log={"path": "/x.log", "error": "Permission denied"})]
    [warning] = failed_load_warnings(failed_loads_by_arm(broken, done))
    assert "could not be read (/x.log: Permission denied)" in warning


def test_results_keep_failed_loads_and_read_documents_without_them() -> None:
    """Additive: the v1 fixture (written before failed loads existed) loads without them, and a
    document with them round-trips and renders them in report.md."""
    text = (FIXTURES / "results-v1-multi-shared-prefix.json").read_text()
    old = RunResults.from_text(text)
    arm = old.scenarios["multi-shared-prefix"].arms["offload"]
    assert arm.failed_loads is None
    arm.failed_loads = FailedLoads(
        2, ["service log /l"], requests_recomputed=2, tokens_recomputed=512,
        per_trial=[{"trial": 0, "failed_loads": 0}, {"trial": 1, "failed_loads": 2}],
        examples=["Recovered from KV load failure: 2 request(s) rescheduled (512 tokens)."],
    )  # fmt: skip
    again = RunResults.from_text(old.to_text())
    assert again.scenarios["multi-shared-prefix"].arms["offload"].failed_loads == arm.failed_loads
    md = markdown(again, [], None)
    assert (
        "failed KV loads, offload: at least 2 (vLLM rescheduled 2 request(s) to recompute 512 "
        "tokens; trial 1: 0, trial 2: 2; from service log /l): recomputed, so the verdict "
        "includes them"
    ) in md
