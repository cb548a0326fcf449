"""The client judges its own health against what it measures; plots degrade without matplotlib."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import pytest

from kvops.abtest.results import smallest_mean_ttft_ms
from kvops.cli.ab_test import auto_workers
from kvops.loadgen.runner import (
    CLIENT_ADDED_SHARE_LIMIT,
    ClientStats,
    client_added_reason,
    judge_client,
)
from kvops.report.abtest_plots import write_plots
from kvops.workload import spec_from_dict
from kvops.workload.record import RequestRecord


def test_quiet_client_is_not_a_bottleneck() -> None:
    s = ClientStats(dispatch_lags_ms=[0.2, 0.3], loop_lags_ms=[0.1, 0.2, 0.3], max_in_flight=64)
    out = s.summary()
    assert out["bottleneck"] is False and out["bottleneck_reason"] is None
    assert out["max_in_flight"] == 64


def test_loop_lag_is_judged_against_ttft() -> None:
    s = ClientStats(loop_lags_ms=[3.0] * 100).summary()
    assert judge_client(s, mean_ttft_ms=50.0)["bottleneck"] is True  # 6% of TTFT
    assert judge_client(s, mean_ttft_ms=5000.0)["bottleneck"] is False  # 0.06% of TTFT
    spiky = ClientStats(loop_lags_ms=[0.1] * 98 + [50.0, 60.0]).summary()
    assert "p99" in str(judge_client(spiky, 100.0)["bottleneck_reason"])  # limit max(20, 10)
    assert judge_client(spiky, 5000.0)["bottleneck"] is False  # limit 500 ms


def test_dispatch_lag_is_judged_against_e2el() -> None:
    s = ClientStats(dispatch_lags_ms=[30.0] * 10).summary()
    assert judge_client(s, None, mean_e2el_ms=100.0)["bottleneck"] is True
    assert judge_client(s, None, mean_e2el_ms=60_000.0)["bottleneck"] is False


def test_client_added_share_is_judged_against_the_smallest_ttft() -> None:
    """1.5 ms of loop lag is 0.75% of a 200 ms mean TTFT (not flagged by the mean rule) but 3%
    of a 50 ms arm: the report says so, with the measured share and the stated limit."""
    s = ClientStats(loop_lags_ms=[1.5] * 100).summary()
    assert judge_client(s, mean_ttft_ms=200.0)["bottleneck"] is False
    out = judge_client(s, mean_ttft_ms=200.0, smallest_ttft_ms=50.0)
    reason = str(out["bottleneck_reason"])
    assert out["bottleneck"] is True and reason.startswith("the client added")
    assert "added about 1.50 ms" in reason and "3.0% of the smallest TTFT" in reason
    assert "(50.0 ms; > 2%)" in reason
    # at or under the stated share, or with no TTFT measured, nothing is said
    assert judge_client(s, 200.0, None, smallest_ttft_ms=75.0)["bottleneck"] is False  # 2.0%
    assert judge_client(s, 200.0, None, smallest_ttft_ms=None)["bottleneck"] is False
    assert client_added_reason(1.5, 0.0) is None
    assert client_added_reason(CLIENT_ADDED_SHARE_LIMIT * 100.0, 100.0) is None
    assert client_added_reason(CLIENT_ADDED_SHARE_LIMIT * 100.0 + 0.01, 100.0) is not None


def test_the_share_joins_the_other_reasons() -> None:
    s = ClientStats(loop_lags_ms=[3.0] * 100, dispatch_lags_ms=[30.0]).summary()
    reason = str(judge_client(s, 50.0, 100.0, smallest_ttft_ms=40.0)["bottleneck_reason"])
    parts = reason.split("; ")
    assert parts[0].startswith("event-loop lag mean") and parts[1].startswith("dispatch lag")
    assert "7.5% of the smallest TTFT measured (40.0 ms" in parts[2]


def _rec(arm: str, ttft_ms: float | None, scenario: str = "s") -> RequestRecord:
    offsets = [] if ttft_ms is None else [ttft_ms, ttft_ms + 10.0]
    return RequestRecord("r", arm=arm, scenario=scenario, chunk_offsets_ms=offsets)


def test_smallest_ttft_is_the_smallest_mean_of_an_arm() -> None:
    """A scenario's arm, not one lucky request: means per (scenario, arm), then the smallest."""
    recs = [_rec("base", 100.0), _rec("base", 60.0), _rec("lmc", 40.0), _rec("lmc", 90.0)]
    recs += [_rec("lmc", 70.0, "other"), _rec("base", None)]
    assert smallest_mean_ttft_ms(recs) == 65.0
    assert smallest_mean_ttft_ms([_rec("base", None)]) is None


def test_auto_workers_spread_256_streams_and_more_over_the_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One event loop up to 255 streams; from 256 one worker per CPU, at most 4."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert auto_workers([spec_from_dict({"batch_size": 40})]) == 1
    assert auto_workers([spec_from_dict({"batch_size": 255})]) == 1
    assert auto_workers([spec_from_dict({"batch_size": 256})]) == 4
    assert (
        auto_workers([spec_from_dict({"batch_size": 8}), spec_from_dict({"batch_size": 512})]) == 4
    )
    assert auto_workers([spec_from_dict({"rate": 5.0, "max_concurrency": 8})]) == 1
    assert auto_workers([spec_from_dict({"rate": 50.0, "max_concurrency": 300})]) == 4
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert auto_workers([spec_from_dict({"batch_size": 512})]) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert auto_workers([spec_from_dict({"batch_size": 512})]) == 1


def test_plots_degrade_with_a_note_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    paths, note = write_plots(tmp_path, {"scenarios": {}}, {})
    assert paths == [] and note is not None and "matplotlib" in note
