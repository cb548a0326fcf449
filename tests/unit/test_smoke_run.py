"""The smoke runner's offline helpers: chunk-file listing and LMCache header checks, KV capacity
from vLLM's metrics, waiting for LMCache's delayed counters, and the CLI's surface."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.parse.prometheus import PrometheusText, parse_prometheus_text
from kvops.smoke import run as smoke_run
from kvops.smoke.run import describe_chunk_file, kv_capacity_tokens, list_chunk_files, snapshot


def _lmcache_file(path: Path, payload_bytes: int, declared_bytes: int | None = None) -> None:
    """A chunk file in LMCache's GDS layout: 8-byte length, JSON padded to 4096, payload."""
    header = json.dumps(
        {"kvcache": {"dtype": "BF16", "shape": [2, 2, 256, 1, 64],
                     "data_offsets": [0, declared_bytes or payload_bytes],
                     "__metadata__": {"lmcache_version": "1"}}}
    ).encode()  # fmt: skip
    head = struct.pack("<Q", len(header)) + header.ljust(4088, b" ")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + b"\0" * payload_bytes)


def test_lists_finished_safetensors_only(tmp_path: Path) -> None:
    _lmcache_file(tmp_path / "12" / "34" / "m%401%400%40ab%40bfloat16.kvcache.safetensors", 64)
    (tmp_path / "12" / "34" / "x.kvcache.safetensors.tmp1a2b3c4d").write_bytes(b"partial")
    (tmp_path / "12" / "34" / "x.kvcache.safetensors.metadata").write_bytes(b"m")
    (tmp_path / "abc").mkdir()
    (tmp_path / "abc" / "model.layers.0.self_attn.attn.safetensors").write_bytes(b"kv")
    found = list_chunk_files(tmp_path)
    assert sorted(Path(p).name for p in found) == [
        "m%401%400%40ab%40bfloat16.kvcache.safetensors",
        "model.layers.0.self_attn.attn.safetensors",
    ]
    assert list_chunk_files(tmp_path / "missing") == set()


def test_lmcache_header_must_match_the_file_size(tmp_path: Path) -> None:
    good = tmp_path / "good.kvcache.safetensors"
    _lmcache_file(good, 1000)
    bad = tmp_path / "bad.kvcache.safetensors"
    _lmcache_file(bad, 1000, declared_bytes=2000)
    short = tmp_path / "short.kvcache.safetensors"
    short.write_bytes(b"x" * 100)
    assert describe_chunk_file(str(good)).header_ok is True
    assert describe_chunk_file(str(good)).size_bytes == 4096 + 1000
    assert describe_chunk_file(str(bad)).header_ok is False
    assert describe_chunk_file(str(short)).header_ok is False
    connector = tmp_path / "layer.safetensors"
    connector.write_bytes(b"kv")
    assert describe_chunk_file(str(connector)).layout == "connector"
    assert describe_chunk_file(str(connector)).header_ok is None


VLLM_METRICS = """\
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="40"} 1.0
# TYPE vllm:external_prefix_cache_hits counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="tiny"} 1920.0
"""


def test_kv_capacity_and_snapshot_from_vllm_metrics() -> None:
    metrics = parse_prometheus_text(VLLM_METRICS)
    assert kv_capacity_tokens(metrics) == 5120
    snap = snapshot(metrics)
    assert snap.get("vllm:external_prefix_cache_hits") == 1920.0
    assert snap.get("lmcache:num_stored_tokens") is None
    assert snap.has_lmcache is False
    assert kv_capacity_tokens(parse_prometheus_text("")) is None


def test_snapshot_reads_the_names_of_older_vllm() -> None:
    old = "# TYPE vllm:gpu_prefix_cache_hits counter\nvllm:gpu_prefix_cache_hits_total 256.0\n"
    assert snapshot(parse_prometheus_text(old)).get("vllm:prefix_cache_hits") == 256.0


def test_cli_lists_smoke_and_its_options() -> None:
    assert "smoke" in CliRunner().invoke(main, ["--help"]).output
    result = CliRunner().invoke(main, ["smoke", "--help"])
    assert result.exit_code == 0
    for option in ("--url", "--gds-dir", "--json", "--model", "--prompt-tokens", "--timeout"):
        assert option in result.output
    assert CliRunner().invoke(main, ["smoke"]).exit_code == 2  # --url is required


class _DelayedLMCache:
    """/metrics of an LMCache engine whose stored-token counter is published late (LMCache's
    stats thread pushes every 10 s): `flat_reads` reads of 0, then 1,536."""

    def __init__(self, flat_reads: int) -> None:
        self.reads = 0
        self.flat_reads = flat_reads

    async def metrics(self) -> PrometheusText:
        self.reads += 1
        value = 0.0 if self.reads <= self.flat_reads else 1536.0
        return parse_prometheus_text(
            f"# TYPE lmcache:num_stored_tokens counter\nlmcache:num_stored_tokens_total {value}\n"
        )


def _settle(server: Any, base_value: float) -> float | None:
    base = snapshot(parse_prometheus_text(f"lmcache:num_stored_tokens_total {base_value}\n"))
    settled = asyncio.run(smoke_run._settled(server, (base, "lmcache:num_stored_tokens")))
    return settled.get("lmcache:num_stored_tokens")


def test_settled_waits_for_lmcache_to_publish_a_rise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke_run.asyncio, "sleep", _no_sleep)
    # flat for longer than the two-equal-reads rule alone would wait
    assert _settle(_DelayedLMCache(flat_reads=6), 0.0) == 1536.0


def test_settled_gives_up_on_a_flat_lmcache_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke_run, "LMCACHE_PUBLISH_S", 0.05)
    server = _DelayedLMCache(flat_reads=10**9)
    assert _settle(server, 0.0) == 0.0  # judged flat (FAIL), only later


_SLEEP = asyncio.sleep


async def _no_sleep(_: float) -> None:
    await _SLEEP(0)


def test_the_service_log_keeps_only_the_lines_naming_an_lmcache_problem(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO Starting vLLM API server\n"
        "\x1b[31;20m[2026-12-04 18:40:01] LMCache ERROR:\x1b[0m Failed to initialize "
        "LMCacheManager components: RuntimeError: No supported cpu connector found. System "
        "will operate in degraded mode (recompute).\n"
        "INFO Application startup complete.\n"
    )
    got = smoke_run.read_service_log(log)
    assert (got.source, got.lines) == (str(log), 3)
    assert len(got.problem_lines) == 1 and "degraded mode (recompute)" in got.problem_lines[0]
    assert got.problem_lines[0].startswith("[2026-12-04 18:40:01] LMCache ERROR: Failed")
    with pytest.raises(smoke_run.SmokeError, match="cannot read the service log"):
        smoke_run.read_service_log(tmp_path / "missing.log")


def test_a_hostile_service_log_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    # one 8 MiB line with no end, then the problem repeated far past what is kept
    log = tmp_path / "vllm.log"
    problem = "System will operate in degraded mode (recompute).\n"
    log.write_text("x" * (8 * 1024 * 1024) + "\n" + problem * 5000)
    got = smoke_run.read_service_log(log)
    assert len(got.problem_lines) == smoke_run.MAX_PROBLEM_LINES
    assert all(len(line) <= 16 * 1024 for line in got.problem_lines)
    assert "degraded mode (recompute)" in got.problem_lines[0]
