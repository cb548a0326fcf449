"""ab-test orchestration pieces that need no server: order, arm comparison, run dir, results."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from kvops.abtest.arms import Arm, ArmInfo, arm_differences, parse_arm
from kvops.abtest.calibration_points import PointsError, load_points
from kvops.abtest.experiment import Options, segment_plan, trial_warnings
from kvops.abtest.result_types import RunResults
from kvops.abtest.results import build_results
from kvops.abtest.rundir import RunDir, RunDirError
from kvops.abtest.validity import HOST_OVERLOADED
from kvops.report.abtest_files import write_reports
from kvops.report.abtest_table import render_table
from kvops.workload import spec_from_dict
from kvops.workload.record import JsonlWriter, RequestRecord, read_records


def test_abba_order() -> None:
    spec = spec_from_dict({"name": "s"})
    a, b = Arm("baseline", "http://a"), Arm("offload", "http://b")
    order = [(t, arm.name) for _, t, arm in segment_plan([spec], [a, b], 4)]
    assert order == [
        (0, "baseline"),
        (0, "offload"),
        (1, "offload"),
        (1, "baseline"),
        (2, "baseline"),
        (2, "offload"),
        (3, "offload"),
        (3, "baseline"),
    ]


def test_parse_arm() -> None:
    assert parse_arm("offload=http://h:8000/") == Arm("offload", "http://h:8000")
    for bad in ("offload", "=http://x", "x=ftp://y"):
        with pytest.raises(ValueError):
            parse_arm(bad)


def _info(name: str, **kw: object) -> ArmInfo:
    base: dict[str, object] = {
        "version": "0.34.0",
        "models": ["m"],
        "max_model_len": 4096,
        "has_metrics": True,
        "cache_config": {"block_size": "16", "kv_connector": "", "enable_prefix_caching": "True"},
    }
    base.update(kw)
    return ArmInfo(name, f"http://{name}", **base)  # type: ignore[arg-type]


def test_only_non_offload_differences_warn() -> None:
    offload = _info(
        "offload",
        cache_config={
            "block_size": "16",
            "kv_connector": "LMCacheConnectorV1",
            "enable_prefix_caching": "True",
        },
    )
    assert arm_differences([_info("baseline"), offload]) == []
    odd = _info("offload", version="0.33.0", cache_config={"block_size": "32"})
    warnings = arm_differences([_info("baseline"), odd])
    assert any("version differs" in w for w in warnings)
    assert any("block_size differs" in w for w in warnings)
    assert any("enable_prefix_caching" in w for w in warnings)
    assert not any("kv_connector" in w for w in warnings)


def _write_run(tmp_path: Path, *, offload_ttft: float = 50.0) -> RunDir:
    spec = spec_from_dict(
        {
            "name": "custom",
            "batch_size": 4,
            "iterations": 4,
            "prompt_tokens": 10,
            "output_tokens": 3,
        }
    )
    rd = RunDir(tmp_path / "run")
    rd.create(
        {
            "arms": [
                {"name": "baseline", "url": "http://a"},
                {"name": "offload", "url": "http://b"},
            ],
            "scenarios": ["custom"],
            "options": Options().to_dict(),
        },
        [spec],
        overwrite=False,
    )
    attempt = rd.add_attempt()
    rd.record_arms(attempt, [_info("baseline").to_dict(), _info("offload").to_dict()])
    t = 0.0
    with JsonlWriter(rd.records_path) as w, rd.segment_writer() as segs:
        for trial in range(2):
            for arm, ttft in (("baseline", 100.0), ("offload", offload_ttft)):
                for it in range(4):
                    for j in range(4):
                        r = RequestRecord(
                            f"{attempt}t{trial}-i{it}-r{j}",
                            arm=arm,
                            scenario="custom",
                            trial=trial,
                            iteration=it,
                            attempt=attempt,
                            warmup=it == 0,
                            send_perf_s=t,
                            chunk_offsets_ms=[ttft + j, ttft + j + 10, ttft + j + 20],
                            prompt_tokens=10,
                            output_tokens=3,
                            cached_tokens=0,
                            dispatch_lag_ms=0.1,
                        )
                        r.end_perf_s = t + (ttft + j + 20) / 1e3
                        w.write_record(r)
                    t += 1.0
                segs.write_obj(
                    {
                        "status": "done",
                        "scenario": "custom",
                        "trial": trial,
                        "arm": arm,
                        "attempt": attempt,
                        "client": {
                            "loop_lag_mean_ms": 0.1,
                            "loop_lag_p99_ms": 0.5,
                            "max_in_flight": 4,
                            "workers": 1,
                        },
                    }
                )
    return rd


def test_results_document_schema(tmp_path: Path) -> None:
    rd = _write_run(tmp_path)
    results = build_results(rd).doc
    doc = results.to_json()
    assert doc["schema_version"] == 1 and doc["status"] == "complete"
    sc = doc["scenarios"]["custom"]
    for arm in ("baseline", "offload"):
        m = sc["arms"][arm]["metrics"]
        for key in (
            "total_token_throughput_tok_s",
            "output_throughput_tok_s",
            "mean_ttft_ms",
            "median_ttft_ms",
            "p99_ttft_ms",
            "mean_itl_ms",
            "mean_tpot_ms",
            "completed",
            "errors",
        ):
            assert key in m
        assert "request_goodput_req_s" not in m  # no SLO given
        assert m["completed"] == 24  # 2 trials x 3 measured iterations x 4; warm-up left out
        assert sc["arms"][arm]["warmup_requests"] == 8
        assert results.scenarios["custom"].arms[arm].metrics.completed == 24
    ttft = next(c for c in sc["comparisons"] if c["metric"] == "mean_ttft_ms")
    assert {
        "metric",
        "baseline",
        "candidate",
        "delta_pct",
        "ci95_low_pct",
        "ci95_high_pct",
        "verdict",
    } <= set(ttft)
    assert ttft["verdict"] == "helps" and ttft["delta_pct"] < -40
    assert doc["client"]["bottleneck"] is False and "dispatch_lag_mean_ms" in doc["client"]
    # the document reads back into the same types and writes the same text
    text = results.to_text()
    assert json.loads(text) == doc
    assert RunResults.from_text(text) == results and RunResults.from_text(text).to_text() == text


def test_reports_and_table(tmp_path: Path) -> None:
    rd = _write_run(tmp_path)
    res = build_results(rd)
    paths = write_reports(rd.path, res.doc, res.measured)
    names = {p.name for p in paths}
    assert {"results.json", "report.md", "report.html"} <= names
    assert any(n.endswith("ttft-cdf.png") for n in names)
    assert "offload helps" in (rd.path / "report.md").read_text()
    buf = io.StringIO()
    render_table(res.doc, Console(file=buf, width=140))
    out = buf.getvalue()
    assert "mean TTFT ms" in out and "helps" in out


def test_run_dir_refuses_to_clobber_and_resumable_state(tmp_path: Path) -> None:
    rd = _write_run(tmp_path)
    spec = spec_from_dict({"name": "custom"})
    with pytest.raises(RunDirError, match="--resume"):
        rd.create({"arms": [], "scenarios": ["custom"], "options": {}}, [spec], overwrite=False)
    done = rd.done_segments()
    assert done[("custom", 1, "offload")] == "a0-"
    run, specs = rd.load_run()
    assert [s.name for s in specs] == ["custom"] and run["attempts"][0]["id"] == "a0-"


def test_unfinished_attempt_is_superseded_by_the_finished_one(tmp_path: Path) -> None:
    rd = _write_run(tmp_path)
    with JsonlWriter(rd.records_path) as w:  # an older, interrupted attempt's leftovers
        w.write_record(
            RequestRecord(
                "stale",
                arm="offload",
                scenario="custom",
                trial=0,
                attempt="a-old",
                chunk_offsets_ms=[9999.0],
                prompt_tokens=1,
                output_tokens=1,
            )
        )
    doc = build_results(rd).doc
    assert doc.scenarios["custom"].arms["offload"].metrics.completed == 24


def test_attempts_order_numerically() -> None:
    from kvops.abtest.results import attempt_number

    assert sorted(["a10-", "a9-", "a0-"], key=attempt_number) == ["a0-", "a9-", "a10-"]


def _edit_records(rd: RunDir, edit: Callable[[RequestRecord], None]) -> None:
    recs = list(read_records(rd.records_path))
    for r in recs:
        edit(r)
    rd.records_path.write_text("".join(r.to_json() + "\n" for r in recs))


def test_a_broken_arm_voids_every_verdict_and_the_status_names_it(tmp_path: Path) -> None:
    """The offload server died in trial 2: its survivors must not be judged."""
    rd = _write_run(tmp_path)

    def kill(r: RequestRecord) -> None:
        if r.arm == "offload" and r.trial == 1 and r.iteration >= 2:
            r.error, r.chunk_offsets_ms = "connection refused", []

    _edit_records(rd, kill)
    doc = build_results(rd).doc
    sc = doc.scenarios["custom"]
    assert {c.verdict for c in sc.comparisons} == {"invalid: 8 errors"}
    assert sc.verdict == "invalid: 8 errors"
    assert doc.status == "invalid"
    assert "arm offload broke in custom: 8 of 24" in doc.status_detail
    assert "trial 2, iteration 3" in doc.status_detail


def _engine_lag(rd: RunDir, lag_ms: dict[str, float]) -> None:
    """Each segment's simulated engine reports `lag_ms[arm]` of mean emission lag."""
    segments = [json.loads(line) for line in rd.segments_path.read_text().splitlines()]
    for d in segments:
        d["engine_lag"] = {"sum_s": lag_ms[d["arm"]] / 1e3 * 50, "steps": 50}
    rd.segments_path.write_text("".join(json.dumps(d) + "\n" for d in segments))


def test_a_host_that_could_not_keep_up_withholds_the_verdicts(tmp_path: Path) -> None:
    """Simulated engines that sent their tokens 45% of their mean TTFT late measured the host:
    the scenario's verdict and every metric's are withheld, the deltas kept, and a warning
    says why. On a host that kept up (3% late) the same run keeps its verdict."""
    rd = _write_run(tmp_path)
    _engine_lag(rd, {"baseline": 3.0, "offload": 3.0})
    kept = build_results(rd).doc
    assert kept.scenarios["custom"].verdict == "helps"
    assert not any("late on average" in w for w in kept.warnings)
    _engine_lag(rd, {"baseline": 45.0, "offload": 3.0})
    doc = build_results(rd).doc
    sc = doc.scenarios["custom"]
    assert sc.verdict == HOST_OVERLOADED
    assert {c.verdict for c in sc.comparisons if not c.verdict.startswith("too few")} == {
        HOST_OVERLOADED
    }
    throughput = sc.comparison("total_token_throughput_tok_s", "offload")
    assert throughput is not None and throughput.delta_pct is not None
    assert throughput.delta_pct > 0
    assert doc.status == "complete"
    (warning,) = [w for w in doc.warnings if "late on average" in w]
    assert "simulated engine baseline" in warning and "its verdicts are withheld" in warning


def test_a_withheld_scenario_is_left_out_of_calibration(tmp_path: Path) -> None:
    """`kvops advise --calibrate` fits the simulator to measured deltas: those of an overloaded
    host measured its contention, so the scenario is left out, and said so."""
    rd = _write_run(tmp_path)
    _engine_lag(rd, {"baseline": 3.0, "offload": 3.0})
    (rd.path / "results.json").write_text(build_results(rd).doc.to_text())
    points, notes = load_points([rd.path])
    assert [p.spec.name for p in points] == ["custom"] and notes == []
    _engine_lag(rd, {"baseline": 3.0, "offload": 60.0})
    (rd.path / "results.json").write_text(build_results(rd).doc.to_text())
    with pytest.raises(PointsError, match=r"\(1 left out, withheld: the host could not keep up\)$"):
        load_points([rd.path])


def test_cache_hits_beyond_the_shared_prefix_warn_of_a_warm_tier(tmp_path: Path) -> None:
    rd = _write_run(tmp_path)
    assert not any("WARM CACHE TIER" in w for w in build_results(rd).doc.warnings)

    def warm(r: RequestRecord) -> None:
        if r.arm == "offload":
            r.cached_tokens = 9  # a unique 10-token prompt cannot be cached within this run

    _edit_records(rd, warm)
    warnings = build_results(rd).doc.warnings
    hits = [w for w in warnings if "WARM CACHE TIER" in w]
    assert len(hits) == 1 and "arm offload" in hits[0] and "gds_path" in hits[0]


def test_odd_or_single_trials_are_flagged() -> None:
    assert trial_warnings(2) == trial_warnings(4) == []
    assert "no verdict" in trial_warnings(1)[0]
    assert "odd" in trial_warnings(3)[0]
