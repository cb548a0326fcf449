"""A stored chunk that cannot be read back is a failed load, recomputed: the simulator's model of
LMCache's GDS backend failing a read (0.5.6 `_load_gds`: the entry is dropped) under vLLM's
`kv_load_failure_policy: recompute` (the request rewinds to its last valid token). The pure model
has no reader and never loses a chunk; `kvops sim serve` gives it one over its chunk files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kvops.sim.gds_files import GdsChunkWriter
from kvops.sim.lmcache_config import LMCacheSettings
from kvops.sim.model import Engine, EngineSettings, Request, build_engine
from kvops.sim.records import SimRequestRecord

pytestmark = pytest.mark.unit


def _tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 128_256, n).tolist()


def _settings() -> EngineSettings:
    lm = LMCacheSettings(local_cpu=False, gds_path="/gds", gds_buffer_size=8192)
    return EngineSettings(offload=True, lmcache=lm)


def _reload(lose: set[int] | None) -> tuple[SimRequestRecord, Engine]:
    """Send a 2,048-token prompt, reset the GPU cache, send it again; the reader (if any)
    reports the chunks at the positions in `lose` unreadable."""
    engine = build_engine(settings=_settings())
    offload = engine.offload
    assert offload is not None
    prompt = _tokens(3, 2048)
    engine.run([Request("a", 0.0, prompt, 1)])
    assert engine.reset_prefix_cache()
    if lose is not None:
        offload.reader = lambda hashes: {h: "gone" for i, h in enumerate(hashes) if i in lose}
    [rec] = engine.run([Request("b", 100.0, prompt, 1)])
    return rec, engine


def test_without_a_reader_the_reload_is_all_offload() -> None:
    rec, engine = _reload(None)
    assert engine.offload is not None
    assert (rec.offload_hit_tokens, rec.computed_prompt_tokens) == (2047, 1)
    assert engine.offload.stats.hit_tokens == 2047
    assert engine.take_failed() == []


def test_an_unreadable_chunk_rewinds_the_request_to_it_and_recomputes_the_rest() -> None:
    rec, engine = _reload({3})
    assert engine.offload is not None
    # chunks 0-2 (768 tokens) came back; from chunk 3 on the prompt is recomputed
    assert rec.offload_hit_tokens == 3 * 256
    assert rec.computed_prompt_tokens == 2048 - 3 * 256
    assert engine.offload.stats.hit_tokens == 3 * 256  # LMCache counts what it retrieved
    [failed] = engine.take_failed()
    assert failed.request_id == "b" and failed.recomputed_tokens == 2047 - 3 * 256
    assert list(failed.why.values()) == ["gone"]
    assert engine.take_failed() == []
    # the lost chunk was dropped and, recomputed, stored again; both requests finished
    assert engine.offload.stats.stored_tokens == (8 + 1) * 256
    assert engine.stats.request_success == 2


def test_the_writer_judges_only_files_it_wrote(tmp_path: Path) -> None:
    writer = GdsChunkWriter(tmp_path, "m", 2, "bfloat16", 1 << 20)
    writer.write([11, 22])
    assert writer.unreadable([11, 22, 33]) == {}  # 33 not written yet: not a lost file
    data = sorted(tmp_path.rglob("*.kvcache.safetensors"))
    os.truncate(data[0], 10)
    [why] = writer.unreadable([11, 22]).values()
    assert why.endswith(f"10 of {writer.file_bytes} bytes")
    data[0].unlink()
    bad = writer.unreadable([11, 22])
    assert "No such file or directory" in next(iter(bad.values()))
    writer.forget(list(bad))
    assert writer.unreadable([11, 22]) == {}  # judged again once written again
    writer.write(list(bad))
    assert writer.unreadable([11, 22]) == {}
