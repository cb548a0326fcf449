"""Profiles are data with sources, and bad names or files fail with a useful message."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.cli.sim import sim
from kvops.sim.profiles import (
    PROFILE_DIR,
    ProfileError,
    known_names,
    load_gpu,
    load_model,
    load_profile,
    load_storage,
)

REQUIRED = {
    "gpu": ["h100-sxm-80gb", "h200-141gb", "a100-sxm-80gb", "l40s-48gb"],
    "model": ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-32b"],
    "storage": [
        "ontap-nfs-rdma-100g", "ontap-nfs-rdma-200g", "ontap-nfs-rdma-400g",
        "ontap-nfs-rdma-2x200g", "ontap-nfs-rdma-4x400g", "local-nvme", "host-dram",
    ],
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(REQUIRED))
def test_required_profiles_ship_and_load(kind: str) -> None:
    names = known_names(kind)  # type: ignore[arg-type]
    for name in REQUIRED[kind]:
        assert name in names
        assert load_profile(kind, name).name == name  # type: ignore[arg-type]


def test_every_number_has_a_source_comment() -> None:
    number = re.compile(r"^\w+:\s*-?[0-9.]+\s*(#.*)?$")
    for path in PROFILE_DIR.glob("*.yaml"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if number.match(line):
                commented = "#" in line or lines[i - 1].lstrip().startswith("#")
                assert commented, f"{path.name}: '{line}' has no source comment"


def test_physics_matches_reference() -> None:
    assert load_model("llama-3.1-8b").kv_bytes_per_token() == 131_072
    assert load_model("llama-3.1-70b").kv_bytes_per_token() == 327_680
    assert load_gpu("h100-sxm-80gb").hbm_bandwidth_gb_s == 3350
    assert load_storage("ontap-nfs-rdma-200g").capacity_gb is None


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"known: .*h100-sxm-80gb"):
        load_gpu("h900")
    with pytest.raises(ProfileError, match="unknown model"):
        load_model("h100-sxm-80gb")  # a GPU name is not a model


def test_missing_field_names_file_and_field(tmp_path: Path) -> None:
    text = (PROFILE_DIR / "h100-sxm-80gb.yaml").read_text()
    broken = tmp_path / "my-gpu.yaml"
    broken.write_text(re.sub(r"(?m)^hbm_bandwidth_gb_s:.*$", "", text))
    with pytest.raises(ProfileError, match=r"my-gpu\.yaml: missing field 'hbm_bandwidth_gb_s'"):
        load_gpu(str(broken))


def test_profile_by_path(tmp_path: Path) -> None:
    path = tmp_path / "fast.yaml"
    path.write_text(
        "kind: storage\nread_bandwidth_gb_s: 100\nwrite_bandwidth_gb_s: 90\n"
        "io_latency_us: 50\ncapacity_gb: null\n"
    )
    assert load_storage(str(path)).read_bandwidth_gb_s == 100.0


def test_cli_unknown_profile_is_usage_error_listing_names() -> None:
    result = CliRunner().invoke(sim, ["serve", "--model", "gpt-9"])
    assert result.exit_code == 2
    assert "llama-3.1-8b" in result.output and "qwen2.5-32b" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_missing_field_is_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "half.yaml"
    path.write_text("kind: storage\nread_bandwidth_gb_s: 10\n")
    result = CliRunner().invoke(sim, ["serve", "--storage", str(path)])
    assert result.exit_code == 2
    assert "half.yaml: missing field 'write_bandwidth_gb_s'" in result.output


def test_cli_run_prints_both_arms_as_json() -> None:
    result = CliRunner().invoke(
        sim, ["run", "--scenario", "one-prefix", "--iterations", "2", "--batch-size", "2"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["baseline"]["num_gpu_blocks"] == out["offload"]["num_gpu_blocks"] > 0
    assert out["offload"]["total_token_throughput_tok_s"] > 0
    assert out["offload"]["mean_itl_ms"] > 0
    assert out["shape"]["request_order"] == "shuffled"


def test_cli_run_takes_the_shape_a_sweep_needs() -> None:
    args = ["run", "--num-prefixes", "3", "--prefix-tokens", "1024", "--prompt-tokens", "1536",
            "--output-tokens", "4", "--batch-size", "6", "--iterations", "3",
            "--request-order", "cyclic", "-tp", "2"]  # fmt: skip
    result = CliRunner().invoke(sim, args)
    assert result.exit_code == 0, result.output
    shape = json.loads(result.output)["shape"]
    assert (shape["num_prefixes"], shape["prefix_tokens"], shape["suffix_tokens"]) == (3, 1024, 512)
    assert shape["request_order"] == "cyclic"
    bad = CliRunner().invoke(sim, ["run", "--prefix-tokens", "100", "--prompt-tokens", "100"])
    assert bad.exit_code == 2 and "--prompt-tokens" in bad.output
