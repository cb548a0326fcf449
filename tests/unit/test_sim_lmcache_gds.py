"""LMCache settings are read as LMCache reads them; chunk files follow its GDS layout."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from kvops.sim.gds_files import HEADER_BYTES, GdsChunkWriter, parse_key
from kvops.sim.lmcache_config import LMCacheConfigError, load_lmcache_settings
from kvops.sim.tokenizer import WordTokenizer


def test_defaults_are_lmcaches() -> None:
    s = load_lmcache_settings(env={})
    assert (s.chunk_size, s.local_cpu, s.max_local_cpu_size, s.gds_path) == (256, True, 5.0, None)
    assert s.save_unfull_chunk is False
    assert any("No LMCache configuration file" in w for w in s.warnings)


def test_file_then_env_then_extra_config(tmp_path: Path) -> None:
    cfg = tmp_path / "lmcache.yaml"
    cfg.write_text(
        "chunk_size: 128\nlocal_cpu: false\ngds_path: /mnt/a\ngds_buffer_size: 8192\n"
        "cufile_bufer_size: 1\nextra_config: {disk_io_threads: 8}\n"
    )
    env = {"LMCACHE_CONFIG_FILE": str(cfg), "LMCACHE_CHUNK_SIZE": "512"}
    s = load_lmcache_settings(env=env, extra_config={"lmcache.gds_path": "/mnt/b"})
    assert s.chunk_size == 512 and s.local_cpu is False and s.gds_path == "/mnt/b"
    assert s.disk_io_threads == 8 and s.staging_buffer_mib == 8192
    assert any("Unknown configuration key: cufile_bufer_size" in w for w in s.warnings)


def test_old_buffer_key_counts_and_missing_buffer_fails_like_lmcache() -> None:
    env = {"LMCACHE_GDS_PATH": "/mnt/x", "LMCACHE_CUFILE_BUFFER_SIZE": "4096"}
    assert load_lmcache_settings(env=env).staging_buffer_mib == 4096
    with pytest.raises(LMCacheConfigError, match="gds_buffer_size"):
        load_lmcache_settings(env={"LMCACHE_GDS_PATH": "/mnt/x"})


def test_sim_reads_values_with_the_validate_reader() -> None:
    """The simulator and `kvops validate` share one reader: LMCache's booleans, not ours."""
    s = load_lmcache_settings(env={"LMCACHE_USE_GDS": "yes", "LMCACHE_LOCAL_CPU": "on"})
    assert s.use_gds is False and s.local_cpu is False
    with pytest.raises(LMCacheConfigError, match="chunk_size"):
        load_lmcache_settings(env={"LMCACHE_CHUNK_SIZE": "lots"})


def test_overlapped_loading_is_refused_not_silently_modelled_as_blocking() -> None:
    for key in ("ENABLE_ASYNC_LOADING", "USE_LAYERWISE"):
        with pytest.raises(LMCacheConfigError, match=f"{key.lower()}: true .* not modelled"):
            load_lmcache_settings(env={f"LMCACHE_{key}": "True"})
        assert load_lmcache_settings(env={f"LMCACHE_{key}": "False"}).chunk_size == 256


def test_env_extra_config_is_json() -> None:
    s = load_lmcache_settings(env={"LMCACHE_EXTRA_CONFIG": '{"use_direct_io": true}'})
    assert s.extra_config == {"use_direct_io": True}


def test_gds_files_layout_header_and_scan(tmp_path: Path) -> None:
    writer = GdsChunkWriter(tmp_path, "meta-llama/Llama-3.1-8B-Instruct", 2, "bfloat16", 1 << 25)
    hashes = [5 << 40, (1 << 64) - 7777, 123456789012345]
    assert writer.write(hashes) == 3 * 2 * 2
    data = sorted(tmp_path.glob("??/??/*.kvcache.safetensors"))
    meta = sorted(tmp_path.glob("??/??/*.kvcache.safetensors.metadata"))
    assert len(data) == len(meta) == 6
    assert not list(tmp_path.rglob("*.tmp*"))
    negative = [p for p in data if p.parent.parent.name.startswith("-")]
    assert negative and "%40-1e61%40bfloat16" in negative[0].name  # signed, hex key
    assert data[0].name.startswith("meta-llama%2FLlama-3.1-8B-Instruct%402%40")
    raw = data[0].read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert len(raw) - HEADER_BYTES == header["kvcache"]["data_offsets"][1]
    assert meta[0].read_bytes() == raw[:HEADER_BYTES]
    key = parse_key(data[0].name)
    assert key is not None and key.world_size == 2
    assert sorted(writer.scan()) == sorted(hashes)
    other = GdsChunkWriter(tmp_path, "some/other-model", 2, "bfloat16", 1 << 25)
    assert other.scan() == []


def test_scan_needs_every_rank(tmp_path: Path) -> None:
    writer = GdsChunkWriter(tmp_path, "m", 2, "bfloat16", 1024)
    writer.write([42 << 50])
    next(tmp_path.glob("??/??/*%400%40*.metadata")).unlink()
    assert writer.scan() == []


def test_tokenizer_round_trips_and_counts_words() -> None:
    tok = WordTokenizer(128_256)
    ids = [0, 1, 99, 128_255, 4242]
    assert tok.encode(tok.decode(ids)) == ids
    assert len(tok.encode("The quick  brown\nfox")) == 4
    assert tok.encode("hello") == tok.encode("hello")
    assert all(0 <= t < 128_256 for t in tok.encode("zzz qqq hello-world 123"))


def test_has_chunk_sees_another_writers_files_once_every_rank_is_there(tmp_path: Path) -> None:
    reader = GdsChunkWriter(tmp_path, "m", 2, "bfloat16", 1 << 20)
    writer = GdsChunkWriter(tmp_path, "m", 2, "bfloat16", 1 << 20)
    h = (1 << 63) + 12345  # a hash LMCache writes negative
    assert not reader.has_chunk(h)
    writer.write([h])
    assert reader.has_chunk(h)
    meta = next(tmp_path.rglob("*%401%40*.metadata"))  # rank 1 (quoted: "@1@")
    meta.unlink()
    assert not reader.has_chunk(h)
