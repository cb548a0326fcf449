"""Campaigns (`kvops ab-test --sweep`): the sweep's parsing, each point's workload, and the
crossover where offload starts to help (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvops.abtest.campaign import (
    Campaign,
    CampaignError,
    PointResult,
    capacity_crossing,
    crossover_vs_capacity,
    find_crossover,
    parse_sweep,
    point_spec,
)
from kvops.abtest.validity import HOST_OVERLOADED
from kvops.report.campaign_plots import campaign_curves, write_campaign_plots
from kvops.workload.spec import load_preset

pytestmark = pytest.mark.unit


def test_the_crossover_is_bracketed_by_the_last_point_that_did_not_help() -> None:
    sweep = parse_sweep("num_prefixes=5,10,15,20,30,40")
    assert sweep.values == (5, 10, 15, 20, 30, 40)
    found = find_crossover(sweep, [
        PointResult(5, "a", "complete", "no significant difference"),
        PointResult(10, "b", "complete", "helps"),  # a lucky point below a null one
        PointResult(15, "c", "complete", "no significant difference"),
        PointResult(20, "d", "complete", "helps"),
        PointResult(30, "e", "complete", "helps"),
        PointResult(40, "f", "pending"),
    ])  # fmt: skip
    assert (found.value, found.after) == (20, 15)
    assert "between num_prefixes = 15 (no significant difference) and 20" in found.text
    none = find_crossover(sweep, [PointResult(5, "a", "complete", "helps"),
                                  PointResult(10, "b", "complete", "hurts")])  # fmt: skip
    assert none.value is None and none.text.startswith("none in range")
    every = find_crossover(sweep, [PointResult(5, "a", "complete", "helps")])
    assert every.value == 5 and every.after is None and "at or below it" in every.text


def test_a_withheld_point_leaves_the_crossover_unknown_not_absent() -> None:
    """A point whose host could not keep up has no verdict: it neither brackets the crossover
    nor says offload does not help."""
    sweep = parse_sweep("num_prefixes=5,10,15")
    below = find_crossover(sweep, [
        PointResult(5, "a", "complete", "no significant difference"),
        PointResult(10, "b", "complete", HOST_OVERLOADED),
        PointResult(15, "c", "complete", "helps"),
    ])  # fmt: skip
    assert (below.value, below.after) == (15, None)
    assert "the crossover is at or below it" in below.text and HOST_OVERLOADED in below.text
    top = find_crossover(sweep, [PointResult(5, "a", "complete", "hurts"),
                                 PointResult(10, "b", "complete", HOST_OVERLOADED)])  # fmt: skip
    assert top.value is None and top.text.startswith("unknown: the verdict at num_prefixes = 10")


def test_a_point_is_the_workload_with_one_value_changed() -> None:
    spec = load_preset("multi-shared-prefix")
    sweep = parse_sweep("prefix_tokens=1000,28000")
    one = point_spec(spec, sweep, 1000)
    assert one.prefix_tokens == 1000 and one.num_prefixes == 20
    assert one.name == "multi-shared-prefix@prefix_tokens=1000"
    # the spec's own rules hold at every point: the prompt must exceed the prefix
    with pytest.raises(CampaignError, match="prompt_tokens"):
        point_spec(spec, parse_sweep("prefix_tokens=1000,30000"), 30000)
    # max_concurrency needs rate mode, as in a spec file
    with pytest.raises(CampaignError, match="rate"):
        point_spec(spec, parse_sweep("max_concurrency=2,4"), 2)
    rate = point_spec(spec, parse_sweep("rate=1,2.5"), 2.5)
    assert rate.rate == 2.5


@pytest.mark.parametrize(
    ("text", "why"),
    [("batch=1,2", "PARAM=V1"), ("num_prefixes=4", "two or more"),
     ("num_prefixes=1.5,2", "integers"), ("rate=0,2", "positive"), ("rate=a,b", "numbers")],
)  # fmt: skip
def test_a_bad_sweep_is_refused_with_its_reason(text: str, why: str) -> None:
    with pytest.raises(CampaignError, match=why):
        parse_sweep(text)


def test_the_campaign_plots_each_arms_throughput_against_ttft(tmp_path: Path) -> None:
    fixture = Path(__file__).parent.parent / "fixtures" / "abtest"
    point = tmp_path / "num_prefixes=20"
    point.mkdir()
    (point / "results.json").write_text(
        (fixture / "results-v1-multi-shared-prefix.json").read_text()
    )
    sweep = parse_sweep("num_prefixes=5,20")
    campaign = Campaign(sweep, load_preset("multi-shared-prefix"), 0.05, 1, [
        PointResult(5, str(tmp_path / "num_prefixes=5"), "pending"),
        PointResult(20, str(point), "complete", "no significant difference"),
    ])  # fmt: skip
    curves = campaign_curves(campaign)
    assert set(curves) == {"baseline", "offload"}
    ((tok_s, mean, p99, label),) = curves["offload"]
    assert label == "20" and tok_s > 0 and p99 >= mean > 0
    paths, note = write_campaign_plots(tmp_path, campaign)
    assert note is None and [p.name for p in paths] == [
        "throughput-vs-mean-ttft.png", "throughput-vs-p99-ttft.png",
    ]  # fmt: skip
    assert all(p.stat().st_size > 1000 for p in paths)


def test_where_the_working_set_outgrows_the_gpu_is_said_beside_the_crossover() -> None:
    sweep = parse_sweep("num_prefixes=1,5,20")
    pts = [
        PointResult(1, "a", "complete", "no significant difference", working_set_tokens=5_000,
                    gpu_kv_capacity_tokens=19_008),
        PointResult(5, "b", "complete", "no significant difference", working_set_tokens=15_000,
                    gpu_kv_capacity_tokens=19_008),
        PointResult(20, "c", "complete", "helps", working_set_tokens=32_120,
                    gpu_kv_capacity_tokens=19_008),
    ]  # fmt: skip
    text = capacity_crossing(sweep, pts)
    assert text == (
        "the working set outgrows the GPU KV capacity between num_prefixes = 5 and 20 "
        "(32,120 > 19,008 tokens; at about num_prefixes = 8.51, linear between the two)"
    )
    assert "fits the GPU KV capacity at every" in str(capacity_crossing(sweep, pts[:2]))
    assert capacity_crossing(sweep, [PointResult(1, "a", "pending")]) is None


def test_a_campaign_never_lands_in_a_used_directory(tmp_path: Path) -> None:
    from kvops.abtest.campaign import run_campaign
    from kvops.abtest.experiment import Hooks
    from kvops.abtest.session import AbTestRequest

    (tmp_path / "run.json").write_text("{}")  # an earlier ab-test run
    campaign = Campaign(parse_sweep("num_prefixes=1,2"), load_preset("multi-shared-prefix"), 0.1, 1)
    with pytest.raises(CampaignError, match="not empty"):
        run_campaign(AbTestRequest(out=tmp_path), campaign, Hooks())
    assert not (tmp_path / "campaign.json").exists()


def test_the_crossover_is_compared_with_where_the_gpu_fills() -> None:
    sweep = parse_sweep("num_prefixes=5,10,15,20")

    def pts(*verdicts: str) -> list[PointResult]:
        return [
            PointResult(v, "x", "complete", verdict, working_set_tokens=ws,
                        gpu_kv_capacity_tokens=7_600)
            for v, verdict, ws in zip(
                (5, 10, 15, 20), verdicts, (4_480, 7_280, 10_080, 12_880), strict=True
            )
        ]  # fmt: skip

    nd = "no significant difference"
    same = pts(nd, nd, "helps", "helps")
    text = crossover_vs_capacity(sweep, find_crossover(sweep, same), same)
    assert str(text).startswith("the crossover and the capacity crossing fall between the same")
    late = pts(nd, nd, nd, "helps")
    assert "only above num_prefixes = 15" in str(
        crossover_vs_capacity(sweep, find_crossover(sweep, late), late)
    )
    early = pts(nd, "helps", "helps", "helps")
    assert "before the working set outgrows" in str(
        crossover_vs_capacity(sweep, find_crossover(sweep, early), early)
    )
    never = pts(nd, nd, nd, nd)
    assert crossover_vs_capacity(sweep, find_crossover(sweep, never), never) is None
