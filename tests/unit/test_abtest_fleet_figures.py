"""An arm of several instances: per-instance figures and the cross-instance hit share, from
the records (who computed a prefix first, each request's cached tokens) and each instance's own
counters (kvops.abtest.fleet_figures), and their place in results.json and the reports."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from kvops.abtest.fleet_figures import (
    cross_instance_hit_share,
    instance_figures,
    instance_url,
    prefix_writers,
)
from kvops.abtest.result_types import RunResults
from kvops.report.abtest_fleet import fleet_lines, fleet_markdown
from kvops.report.abtest_table import render_table
from kvops.workload.record import RequestRecord

A, B = "http://a:8000", "http://a:80"  # one URL a prefix of the other: matched whole
FIXTURE = Path(__file__).parents[1] / "fixtures" / "abtest" / "results-v1-multi-shared-prefix.json"


def rec(
    url: str, prefix: int | None, sent: float, cached: int | None, **kw: object
) -> RequestRecord:
    return RequestRecord(
        request_id=f"{url}-{prefix}-{sent}", url=url + "/v1/completions", arm="offload",
        scenario="s", prefix_id=prefix, send_time_unix_s=sent, cached_tokens=cached,
        chunk_offsets_ms=[10.0 * sent + 5.0], **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_the_writer_is_the_instance_of_the_earliest_successful_request() -> None:
    records = [
        rec(B, 0, 2.0, 0),
        rec(A, 0, 1.0, 0, error="HTTP 500: boom"),  # failed: it stored nothing
        rec(A, 0, 3.0, 0),
        rec(A, 1, 1.5, 0),
        rec(B, None, 0.5, 0),
    ]
    assert instance_url(A + "/v1/chat/completions") == A
    assert prefix_writers(records) == {("offload", "s", 0): B, ("offload", "s", 1): A}


def test_hits_split_by_the_cached_tokens_of_cross_instance_requests() -> None:
    warm = [rec(A, 0, 0.0, 0, warmup=True), rec(B, 1, 0.1, 0, warmup=True)]
    measured = [
        rec(A, 0, 1.0, 1000),  # A wrote prefix 0: its own
        rec(A, 1, 1.1, 3000),  # B wrote prefix 1: cross-instance
        rec(B, 0, 1.2, 2000),  # cross-instance
        rec(B, None, 1.3, 0),
    ]
    writers = prefix_writers(warm + measured)
    counters = {
        A: {"external_hit_tokens": 2000.0, "prefix_cache_hits": 0.0, "gpu_hit_tokens": 2000.0},
        B: {"external_hit_tokens": 2000.0, "gpu_hit_tokens": 0.0, "lmcache_stored_tokens": 512.0},
    }
    figs = instance_figures([A, B], measured, counters, writers)
    a, b = figs
    assert (a.url, a.requests, a.errors) == (A, 2, 0)
    assert a.offload_hit_tokens == 2000.0 and a.cross_instance_hit_tokens == 1500.0
    assert a.cross_instance_hit_share == 0.75
    assert b.cross_instance_hit_tokens == 2000.0 and b.stored_tokens == 512.0
    assert b.mean_ttft_ms == pytest.approx((17.0 + 18.0) / 2)
    assert cross_instance_hit_share(figs) == 3500.0 / 4000.0


def test_affinity_shaped_traffic_has_no_cross_instance_hits() -> None:
    measured = [rec(A, 0, 1.0, 1000), rec(B, 1, 1.1, 1000), rec(A, 0, 2.0, 1000)]
    counters = {A: {"external_hit_tokens": 900.0}, B: {"external_hit_tokens": 100.0}}
    figs = instance_figures([A, B], measured, counters, prefix_writers(measured))
    assert [f.cross_instance_hit_tokens for f in figs] == [0.0, 0.0]
    assert cross_instance_hit_share(figs) == 0.0


def test_what_is_not_reported_stays_none_never_zero() -> None:
    measured = [rec(A, 0, 1.0, None), rec(B, 0, 2.0, None)]
    writers = prefix_writers(measured)
    # B loaded but its records carry no cached tokens; A has no /metrics at all
    figs = instance_figures([A, B], measured, {B: {"external_hit_tokens": 10.0}}, writers)
    assert figs[0].offload_hit_tokens is None and figs[0].cross_instance_hit_tokens is None
    assert figs[1].offload_hit_tokens == 10.0 and figs[1].cross_instance_hit_tokens is None
    assert cross_instance_hit_share(figs) is None
    zero = {"external_hit_tokens": 0.0}
    nothing = instance_figures([A, B], measured, {A: zero, B: zero}, writers)
    assert cross_instance_hit_share(nothing) is None  # nothing loaded: no share to speak of
    assert nothing[1].cross_instance_hit_tokens == 0.0


def test_the_document_carries_instances_only_for_fleet_arms_and_reads_back() -> None:
    doc = RunResults.from_text(FIXTURE.read_text())
    sc = doc.scenarios["multi-shared-prefix"]
    assert "instances" not in json.dumps(doc.to_json())  # one-URL arms: unchanged document
    measured = [rec(A, 0, 1.0, 1000), rec(B, 0, 2.0, 1000)]
    figs = instance_figures(
        [A, B], measured, {A: {"external_hit_tokens": 0.0}, B: {"external_hit_tokens": 800.0}},
        prefix_writers(measured),
    )  # fmt: skip
    sc.arms["offload"].instances = figs
    sc.arms["offload"].cross_instance_hit_share = cross_instance_hit_share(figs)
    doc.options["route"] = "prefix-handoff"
    text = doc.to_text()
    back = RunResults.from_text(text)
    assert back.to_text() == text
    block = json.loads(text)["scenarios"]["multi-shared-prefix"]["arms"]["offload"]
    assert block["cross_instance_hit_share"] == 1.0
    assert [i["url"] for i in block["instances"]] == [A, B]
    lines = fleet_lines(back.scenarios["multi-shared-prefix"], "prefix-handoff")
    assert lines[0] == (
        "offload: 2 instances, route prefix-handoff; cross-instance hit share 100% of its "
        "offload hits"
    )
    assert "cross-instance 800" in lines[2]
    table = "\n".join(fleet_markdown(back.scenarios["multi-shared-prefix"], "prefix-handoff"))
    assert f"| offload | {B} | 1 | 0 |" in table
    console = Console(file=io.StringIO(), width=200)
    render_table(back, console)
    assert "cross-instance hit share 100%" in console.file.getvalue()  # type: ignore[attr-defined]
