"""The embedded A/B engines get the same GPU KV memory, as the vllm_lmcache role gives every
variant the same `vllm_lmcache_kv_cache_memory_bytes` (issue 27: a smaller offload KV pool made
unique one-shot mean ITL read "helps" with nothing loaded from storage)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvops.abtest.embedded import EmbeddedEngines, SimProfile
from kvops.abtest.predict import embedded_arms
from kvops.sim.model import EngineError, EngineSettings, build_engine
from kvops.sim.model import LMCacheSettings as Lm

pytestmark = pytest.mark.unit


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_both_embedded_engines_are_launched_with_one_kv_memory(tmp_path: Path) -> None:
    engines = EmbeddedEngines(tmp_path, 0.1)
    base = _flag(engines.command(1, offload=False), "--kv-cache-memory-bytes")
    off = _flag(engines.command(2, offload=True), "--kv-cache-memory-bytes")
    assert base is not None and base == off
    # what the default utilisation leaves once the offload engine's 8 GiB buffer is on the GPU
    assert int(base) == SimProfile().kv_cache_memory_bytes() > 30 * 1024**3


def test_the_modelled_arms_have_equal_kv_blocks() -> None:
    for scale in (1.0, 0.1):
        baseline, offload = embedded_arms(scale)
        blocks = [build_engine(settings=a.settings).cache.num_blocks for a in (baseline, offload)]
        assert blocks[0] == blocks[1] > 0, blocks
    # a larger GDS buffer shrinks both arms alike, not the offload arm alone
    big = embedded_arms(1.0, SimProfile(gds_buffer_mib=16384))
    assert len({build_engine(settings=a.settings).cache.num_blocks for a in big}) == 1


def test_kv_cache_memory_bytes_sizes_the_cache_and_must_fit() -> None:
    gib = 1024**3
    engine = build_engine(settings=EngineSettings(kv_cache_memory_bytes=10 * gib))
    # Llama-3.1-8B: 128 KiB of KV per token, so 10 GiB hold 81,920 tokens (5,120 blocks of 16)
    assert engine.cache.num_blocks == 5120
    lm = Lm(local_cpu=False, gds_path="/g", gds_buffer_size=8192)
    off = build_engine(
        settings=EngineSettings(kv_cache_memory_bytes=10 * gib, offload=True, lmcache=lm)
    )
    assert off.cache.num_blocks == 5120
    with pytest.raises(EngineError, match="does not fit"):
        build_engine(settings=EngineSettings(kv_cache_memory_bytes=80 * gib))


def test_the_report_names_a_fixed_kv_memory() -> None:
    from kvops.report.abtest_files import kv_memory_note

    note = kv_memory_note({"num_gpu_blocks": "2376", "block_size": "16",
                           "kv_cache_memory_bytes": str(5 * 1024**3)})  # fmt: skip
    assert "KV memory fixed at 5.00 GiB per GPU" in note
    assert "fixed" not in kv_memory_note({"num_gpu_blocks": "1", "kv_cache_memory_bytes": "None"})
