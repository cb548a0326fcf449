"""The done-when checks of `kvops advise`: the three reference presets get the reference
outcomes (no gain, no gain, a large gain) with the numbers that justify them, and the
break-even bandwidth and the read-bandwidth flip point found by simulation agree with the
closed form within 10%."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from kvops.advise.analysis import AdviseOptions, Analysis, analyse
from kvops.advise.arms import Profiles
from kvops.advise.recommend import HELPS, NO_GAIN, advise
from kvops.advise.trace import ReadOptions, load_workload, spec_workload
from kvops.advise.workload import PromptBuilder
from kvops.cli import main
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.workload.spec import load_preset

PROFILES = Profiles(
    load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
)


def _analyse(preset: str, **kw: bool) -> Analysis:
    workload = load_workload(preset, ReadOptions(), PROFILES.model.vocab_size, "x")
    builder = PromptBuilder(PROFILES.model.vocab_size, 512)
    return analyse(workload, PROFILES, AdviseOptions(**kw), builder)


@pytest.fixture(scope="module")
def multi() -> Analysis:
    return _analyse("multi-shared-prefix")


def test_unique_prompts_no_gain_case_1() -> None:
    a = _analyse("unique-one-shot", corners=False, flips=False)
    advice = advise(a)
    assert advice.verdict == NO_GAIN and advice.case == 1 and advice.offload == "off"
    assert a.reuse.reuse_share == 0 and a.offload.offload_hit_tokens == 0
    assert abs(a.delta("total_token_throughput_tok_s").pct) < 5


def test_one_resident_prefix_no_gain_case_2() -> None:
    a = _analyse("single-shared-prefix", corners=False, flips=False)
    advice = advise(a)
    assert advice.verdict == NO_GAIN and advice.case == 2 and advice.offload == "off"
    # The GPU prefix cache alone already serves the shared prefix.
    assert a.baseline.gpu_hit_rate > 0.9
    assert a.offload.total_hit_rate == pytest.approx(a.baseline.gpu_hit_rate, abs=0.01)


def test_many_overflowing_prefixes_help_case_3(multi: Analysis) -> None:
    advice = advise(multi)
    assert advice.verdict == HELPS and advice.case == 3 and advice.offload == "on"
    # The reference measured +61% throughput and -34% mean TTFT; the model must agree in sign
    # and be large.
    assert multi.delta("total_token_throughput_tok_s").pct > 30
    assert multi.delta("mean_ttft_ms").pct < -20
    assert multi.reuse.shared_working_set_tokens > multi.sizing.gpu_kv_capacity_tokens
    # Requests go out shuffled (as vllm bench serve sends them), so the GPU cache alone keeps
    # some prefixes between their uses; offload serves far more of them.
    assert multi.offload.total_hit_rate > multi.baseline.gpu_hit_rate + 0.25
    assert any("reference case 3" in line for line in advice.explanation)


def test_cpu_tier_is_simulated_at_the_working_set_size(multi: Analysis) -> None:
    tier = multi.cpu_tier
    assert tier is not None
    working_set_gb = multi.reuse.shared_working_set_tokens * multi.sizing.kv_bytes_per_token / 1e9
    assert tier.size_gb == pytest.approx(1.2 * working_set_gb, abs=0.05)
    # Host DRAM (55 GB/s) reads faster than one 200 GbE link (21 GB/s): the tier pays here.
    assert tier.throughput_gain_pct > 5
    assert advise(multi).settings["cpu_tier_gb"] == tier.size_gb


def test_simulated_break_even_and_flip_agree_with_closed_form() -> None:
    """The closed form prices reading a prefix against recomputing it, which is the baseline's
    lot when every prefix misses: cyclic order (LRU evicts each prefix before its next use).
    Shuffled order lets the baseline's GPU cache keep some, which raises the break-even."""
    spec = dataclasses.replace(load_preset("multi-shared-prefix"), request_order="cyclic")
    cyclic = analyse(
        spec_workload(spec, PROFILES.model.vocab_size, "cyclic"),
        PROFILES,
        AdviseOptions(corners=False),
        PromptBuilder(PROFILES.model.vocab_size, 512),
    )
    closed = cyclic.sizing.break_even_read_gb_s
    assert cyclic.sim_break_even_gb_s is not None and cyclic.flip_read_gb_s is not None
    assert cyclic.sim_break_even_gb_s == pytest.approx(closed, rel=0.10)
    assert cyclic.flip_read_gb_s == pytest.approx(closed, rel=0.10)


def test_ranges_bracket_the_nominal(multi: Analysis) -> None:
    assert multi.corner_names == ["worst case for offload", "best case for offload"]
    thr, ttft = multi.delta("total_token_throughput_tok_s"), multi.delta("mean_ttft_ms")
    assert thr.low_pct < thr.pct < thr.high_pct
    assert ttft.low_pct < ttft.pct < ttft.high_pct
    # Even the worst corner keeps the large gain: the verdict holds over the whole range.
    assert advise(multi).readings == [HELPS, HELPS, HELPS]


def test_storage_below_break_even_changes_the_answer() -> None:
    crawl = Profiles(
        PROFILES.model,
        PROFILES.gpu,
        dataclasses.replace(PROFILES.storage, read_bandwidth_gb_s=1.0),  # a third of break-even
    )
    workload = load_workload("multi-shared-prefix", ReadOptions(), PROFILES.model.vocab_size, "x")
    builder = PromptBuilder(PROFILES.model.vocab_size, 512)
    b = analyse(workload, crawl, AdviseOptions(corners=False, flips=False), builder)
    assert b.delta("total_token_throughput_tok_s").pct < 0
    assert advise(b).verdict != HELPS and advise(b).offload == "off"
    assert any("below the" in line and "break-even" in line for line in advise(b).explanation)


def test_cli_json_and_markdown_carry_the_verdict() -> None:
    result = CliRunner().invoke(main, ["advise", "single-shared-prefix", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["verdict"] == "no gain" and data["reference_case"] == 2
    for key in (
        "prefix_hit_rate_gpu_only", "prefix_hit_rate_with_offload", "deltas",
        "gpu_kv_capacity_tokens", "break_even_read_gb_s", "flip_points", "recommended_settings",
        "explanation",
    ):  # fmt: skip
        assert key in data
    md = CliRunner().invoke(main, ["advise", "single-shared-prefix", "--quick", "--markdown"])
    assert md.exit_code == 0
    assert md.stdout.startswith("# kvops advise: offload **no gain**")
    assert "| throughput (tok/s) |" in md.stdout
