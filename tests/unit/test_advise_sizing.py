"""`kvops advise sizing`: the closed form, checked against values derived by hand from the
shipped profiles (Llama-3.1-8B config.json, H100 SXM datasheet, the ONTAP 200 GbE profile)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvops.advise.sizing import Sizing, SizingError, SizingInputs, compute_sizing
from kvops.cli import main
from kvops.sim.profiles import load_gpu, load_model, load_storage

# Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16 (2 B):
KV_8B = 2 * 32 * 8 * 128 * 2  # = 131,072 B per token
# H100: 81,559 MiB x 0.9 = 76,968,728,985.6 B; weights 8.03e9 x 2 = 16.06e9 B;
# activations 8192 x (2 x 14336 + 4 x 4096) x 2 + 256 x 128256 x 4 = 869,531,648 B;
# runtime 1.5 GiB = 1,610,612,736 B -> 58,428,584,601.6 B free / 131,072 = 445,774 tokens
# -> 27,860 whole 16-token blocks = 445,760 tokens.
CAPACITY_8B_H100 = 445_760
# Prefill of 28,000 tokens: 2 x 8.03e9 x 28000 + 4 x 32 x 4096 x 28000 x 14000 = 6.55200e14 FLOPs
# at 989e12 x 0.55 = 5.4395e14 FLOP/s -> 1.204524 s.
PREFILL_28K_S = (2 * 8.03e9 * 28000 + 4 * 32 * 4096 * 28000 * 14000) / (989e12 * 0.55)
# Full 256-token chunks of 28,000 tokens: 109 chunks = 27,904 tokens = 3,657,433,088 B; read at
# 21.25 GB/s = 0.172115 s, plus ceil(109 / 4 I/O threads) = 28 rounds x 200 us = 5.6 ms.
LOAD_28K_S = 27_904 * KV_8B / 21.25e9 + 28 * 200e-6
# Break-even: 28,000 x 131,072 B / 1.204524 s = 3.0469 GB/s.
BREAK_EVEN_GB_S = 28_000 * KV_8B / PREFILL_28K_S / 1e9


def _sizing(**kw: Any) -> Sizing:
    inputs = dataclasses.replace(SizingInputs(prefix_tokens=28_000, num_prefixes=20), **kw)
    return compute_sizing(
        load_model("llama-3.1-8b"),
        load_gpu("h100-sxm-80gb"),
        load_storage("ontap-nfs-rdma-200g"),
        inputs,
    )


def test_reference_case_matches_hand_derivation() -> None:
    s = _sizing()
    assert s.kv_bytes_per_token == KV_8B == 131_072
    assert s.gpu_kv_capacity_tokens == CAPACITY_8B_H100
    assert s.prefixes_fit_in_gpu == 15  # 445,760 // 28,000
    assert s.storage_bytes_needed == 20 * 3_657_433_088
    assert s.prefill_seconds_per_prefix == pytest.approx(1.204524, rel=1e-5)
    assert s.load_seconds_per_prefix == pytest.approx(LOAD_28K_S, rel=1e-9)
    assert s.load_seconds_per_prefix == pytest.approx(0.177715, rel=1e-5)
    assert s.break_even_read_gb_s == pytest.approx(3.0469, rel=1e-4)
    assert s.break_even_read_gb_s == pytest.approx(BREAK_EVEN_GB_S)
    assert s.overflows_gpu


def test_tensor_parallel_doubles_capacity_roughly_and_keeps_break_even() -> None:
    one, two = _sizing(), _sizing(tensor_parallel_size=2)
    # Weights halve per rank, so free memory more than doubles in tokens.
    assert two.gpu_kv_capacity_tokens > 2 * one.gpu_kv_capacity_tokens
    # The prefix's bytes are the same in total, its recompute is split over two ranks' compute:
    # recomputing is twice as fast, so the storage must be twice as fast to beat it.
    assert two.break_even_read_gb_s == pytest.approx(2 * one.break_even_read_gb_s)
    # Two ranks write two files per chunk: more I/O rounds.
    assert two.load_seconds_per_prefix > one.load_seconds_per_prefix


def test_few_prefixes_fit_and_say_so() -> None:
    s = _sizing(num_prefixes=3)
    assert s.prefixes_fit_in_gpu == 3
    assert not s.overflows_gpu


def test_model_too_big_for_gpu_is_an_error() -> None:
    with pytest.raises(SizingError, match="weights"):
        compute_sizing(
            load_model("llama-3.1-70b"),
            load_gpu("h100-sxm-80gb"),
            load_storage("ontap-nfs-rdma-200g"),
            SizingInputs(28_000, 20),
        )


def test_cli_json_names_and_values() -> None:
    args = ["advise", "sizing", "--prefix-tokens", "28000", "--num-prefixes", "20", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for name in (
        "kv_bytes_per_token",
        "gpu_kv_capacity_tokens",
        "prefixes_fit_in_gpu",
        "storage_bytes_needed",
        "prefill_seconds_per_prefix",
        "load_seconds_per_prefix",
        "break_even_read_gb_s",
    ):
        assert name in data
    assert data["gpu_kv_capacity_tokens"] == CAPACITY_8B_H100
    assert data["break_even_read_gb_s"] == pytest.approx(BREAK_EVEN_GB_S)


def test_cli_terminal_explains_and_slow_storage_flips_the_reading(tmp_path: Path) -> None:
    args = ["advise", "sizing", "--prefix-tokens", "28000", "--num-prefixes", "20"]
    fast = CliRunner().invoke(main, args)
    assert fast.exit_code == 0
    assert "break-even read bandwidth    3.05 GB/s" in fast.output
    assert "faster than recomputing" in fast.output
    assert "overflow GPU memory" in fast.output
    slow = tmp_path / "slow.yaml"
    slow.write_text(
        "kind: storage\nread_bandwidth_gb_s: 2.0\nwrite_bandwidth_gb_s: 2.0\n"
        "io_latency_us: 200\ncapacity_gb: null\n"
    )
    result = CliRunner().invoke(main, [*args, "--storage", str(slow)])
    assert result.exit_code == 0
    assert "Recomputing a prefix is faster" in result.output


def test_cli_unknown_profile_lists_known_names_without_traceback() -> None:
    args = ["advise", "sizing", "--prefix-tokens", "1", "--num-prefixes", "1", "--gpu", "b200"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "h100-sxm-80gb" in result.output and "known" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_model_too_big_exits_2_with_one_line() -> None:
    args = ["advise", "sizing", "--prefix-tokens", "1", "--num-prefixes", "1"]
    result = CliRunner().invoke(main, [*args, "--model", "llama-3.1-70b"])
    assert result.exit_code == 2
    assert result.output.startswith("kvops advise sizing: error: no memory left for the KV cache")
    assert result.output.count("\n") == 1
