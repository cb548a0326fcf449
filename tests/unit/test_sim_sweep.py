"""`kvops sim sweep`: one parameter through both arms, the flip point and the break-even."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvops.cli.sim import sim
from kvops.sim.seed_workloads import Summary
from kvops.sim.sweep import SweepError, SweepPoint, find_flip, parse_sweep

pytestmark = pytest.mark.unit


def test_parse_sweep_sorts_and_refuses_what_cannot_run() -> None:
    assert parse_sweep("read_bandwidth_gb_s=8,2,4") == ("read_bandwidth_gb_s", [2.0, 4.0, 8.0])
    assert parse_sweep("num-prefixes=1,20")[0] == "num_prefixes"
    for bad in ("bogus=1,2", "num_prefixes=1", "num_prefixes=1.5,2", "output_tokens=a,b", "x"):
        with pytest.raises(SweepError):
            parse_sweep(bad)


def _point(value: float, base: float, off: float) -> SweepPoint:
    def s(tput: float) -> Summary:
        return Summary(1.0, tput, 100.0, 0, 0, 10.0)

    return SweepPoint(value, s(base), s(off), 3.0)


def test_flip_is_interpolated_where_the_delta_changes_sign() -> None:
    points = [_point(1, 100, 50), _point(2, 100, 90), _point(4, 100, 130)]
    flip = find_flip(points)
    assert flip is not None and (flip.low, flip.high) == (2, 4) and flip.helps_above
    assert flip.at == pytest.approx(2 + 2 * 10 / 40)
    assert find_flip([_point(1, 100, 120), _point(2, 100, 150)]) is None


def test_cli_sweep_of_read_bandwidth_finds_the_flip_near_the_break_even() -> None:
    # 20 x 28K-token prefixes overflow the H100's KV cache; a short run of them
    shape = ["--batch-size", "20", "--iterations", "2", "--output-tokens", "8"]
    result = CliRunner().invoke(
        sim, ["sweep", "read_bandwidth_gb_s=0.5,2,8,32,128", *shape, "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    deltas = [p["total_token_throughput_tok_s_delta_pct"] for p in doc["points"]]
    assert deltas == sorted(deltas)  # faster reads never make offload worse
    assert doc["flip"] is not None and doc["flip"]["helps_above"]
    break_even = doc["points"][0]["break_even_read_gb_s"]
    assert doc["flip"]["low"] <= break_even * 2 and doc["flip"]["high"] >= break_even / 2
    text = CliRunner().invoke(sim, ["sweep", "read_bandwidth_gb_s=0.5,128", *shape])
    assert "flips from hurting to helping" in text.output and "break-even" in text.output
    bad = CliRunner().invoke(sim, ["sweep", "speed=1,2"])
    assert bad.exit_code == 2 and "PARAM" in bad.output


def test_a_cpu_dram_tier_in_front_of_slow_gds_serves_the_hits_faster() -> None:
    """LMCache reads the fastest tier holding a chunk: a DRAM tier big enough for the prefixes
    beats a slow GDS path alone; a tiny one cannot hold them and changes little."""
    shape = ["--batch-size", "20", "--iterations", "2", "--output-tokens", "8",
             "--storage", "ontap-nfs-rdma-100g"]  # fmt: skip

    def offload_tput(gb: str) -> float:
        result = CliRunner().invoke(sim, ["run", *shape, "--cpu-tier-gb", gb])
        assert result.exit_code == 0, result.output
        return float(json.loads(result.output)["offload"]["total_token_throughput_tok_s"])

    gds_only, big, tiny = offload_tput("0"), offload_tput("200"), offload_tput("1")
    assert big > gds_only * 1.2
    assert tiny == pytest.approx(gds_only, rel=0.1)


def test_the_gds_buffer_comes_out_of_the_offload_arms_kv_cache_and_is_shown() -> None:
    """--gds-buffer-mib is VRAM the offload arm's KV pool loses (reported per arm); 0 gives
    both arms the same pool."""
    shape = ["--scenario", "one-prefix", "--batch-size", "2", "--iterations", "2",
             "--prefix-tokens", "512", "--prompt-tokens", "600",
             "--output-tokens", "4"]  # fmt: skip

    def arms(*extra: str) -> dict[str, dict[str, float]]:
        result = CliRunner().invoke(sim, ["run", *shape, *extra])
        assert result.exit_code == 0, result.output
        doc: dict[str, dict[str, float]] = json.loads(result.output)
        return doc

    default, none, big = arms(), arms("--gds-buffer-mib", "0"), arms("--gds-buffer-mib", "16384")
    assert (
        default["offload"]["gds_buffer_mib"] == 8192 and default["baseline"]["gds_buffer_mib"] == 0
    )
    # both arms always get the same KV memory (as the vllm_lmcache role gives its variants):
    # the buffer shrinks both, not the offload arm alone (issue 27)
    for doc in (default, none, big):
        assert doc["offload"]["num_gpu_blocks"] == doc["baseline"]["num_gpu_blocks"]
    # 8 GiB of an 8B model's 128 KiB-per-token KV (16-token blocks: 2 MiB each) = 4096 blocks
    lost = none["baseline"]["num_gpu_blocks"] - default["baseline"]["num_gpu_blocks"]
    assert lost == pytest.approx(4096, abs=1)
    assert big["offload"]["num_gpu_blocks"] == pytest.approx(
        default["offload"]["num_gpu_blocks"] - 4096, abs=1
    )


def test_scale_shrinks_lengths_and_kv_cache_as_ab_test_does() -> None:
    full = CliRunner().invoke(sim, ["run", "--iterations", "2", "--batch-size", "4"])
    small = CliRunner().invoke(sim, ["run", "--iterations", "2", "--batch-size", "4",
                                     "--scale", "0.1"])  # fmt: skip
    assert full.exit_code == 0 and small.exit_code == 0, small.output
    f, s = json.loads(full.output), json.loads(small.output)
    # the multi-shared-prefix preset's lengths under `kvops ab-test --scale 0.1`
    assert (s["shape"]["prefix_tokens"], s["shape"]["suffix_tokens"]) == (2800, 200)
    assert s["shape"]["output_tokens"] == 6
    for arm in ("baseline", "offload"):
        assert s[arm]["num_gpu_blocks"] == pytest.approx(f[arm]["num_gpu_blocks"] * 0.1, abs=1)
