"""`kvops gds prune`: an LMCache GDS directory kept under its budget, least recently used first,
a chunk's files together (metadata first), nothing that is not LMCache's touched.

The directory is built in LMCache 0.5.6's layout (`<h[:2]>/<h[2:4]>/<key>.kvcache.safetensors`
plus `.metadata`, writes in flight as `.tmp<8 hex>`: lmcache/v1/storage_backend/gds_backend.py)
with access times set per chunk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.gds.prune import PruneRequest, cutoff_for_budget, prune
from kvops.gds.units import parse_duration_s, parse_size_bytes

NOW_S = 1_790_000_000.0  # September 2026: in the past of any run
DAY_S = 86400.0
KIB = 1024


def _chunk(root: Path, n: int, age_s: float, size: int = 100 * KIB) -> Path:
    h = f"{n:06d}"
    data = root / h[:2] / h[2:4] / f"tiny@1@0@{n:x}@float32.kvcache.safetensors"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_bytes(b"k" * size)
    meta = Path(f"{data}.metadata")
    meta.write_bytes(b"m" * 4 * KIB)
    for path in (data, meta):
        os.utime(path, (NOW_S - age_s, NOW_S - age_s))
    return data


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "gds"
    for n in range(10):  # chunk n last used n days ago
        _chunk(root, n, age_s=n * DAY_S + 60)
    return root


def _run(req: PruneRequest) -> dict[str, object]:
    from kvops.gds.prune import Pruner

    return Pruner(req, now_s=lambda: NOW_S).run().to_dict()


def _left(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_a_byte_budget_removes_the_least_recently_used_chunks_whole(store: Path) -> None:
    per_chunk = 104 * KIB
    report = _run(PruneRequest(str(store), max_bytes=4 * per_chunk))
    assert report["chunks_found"] == 10 and report["chunks_removed"] == 6
    assert report["bytes_freed"] == 6 * per_chunk and report["bytes_left"] == 4 * per_chunk
    left = _left(store)
    assert len(left) == 8  # four chunks, each its data and its metadata
    kept = {name.split("@")[3] for name in left}
    assert kept == {"0", "1", "2", "3"}  # the four most recently used


def test_dry_run_reports_the_same_and_removes_nothing(store: Path) -> None:
    before = _left(store)
    report = _run(PruneRequest(str(store), max_bytes=4 * 104 * KIB, dry_run=True))
    assert report["chunks_removed"] == 6 and report["dry_run"] is True
    assert _left(store) == before


def test_an_age_limit_and_the_recent_chunks_it_never_touches(store: Path) -> None:
    report = _run(PruneRequest(str(store), max_age_s=4.5 * DAY_S))
    assert report["chunks_removed"] == 5  # 5..9 days old
    # a budget below what was used in the last --min-age keeps those chunks anyway
    report = _run(PruneRequest(str(store), max_bytes=0, min_age_s=2.5 * DAY_S))
    assert report["chunks_removed"] == 2 and report["bytes_left"] == 3 * 104 * KIB


def test_only_lmcache_files_are_touched(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "precious.kvcache.safetensors"
    outside.write_bytes(b"x")
    os.utime(outside, (0, 0))
    (store / "00" / "link.kvcache.safetensors").symlink_to(outside)
    foreign = store / "00" / "notes.txt"
    foreign.write_text("keep me")
    os.utime(foreign, (0, 0))
    old_tmp = store / "00" / "00" / "a.kvcache.safetensors.tmp0123abcd"
    new_tmp = store / "00" / "00" / "b.kvcache.safetensors.metadata.tmp89abcdef"
    orphan = store / "00" / "00" / "gone.kvcache.safetensors.metadata"
    for path in (old_tmp, new_tmp, orphan):
        path.write_bytes(b"t")
    os.utime(old_tmp, (NOW_S - 7200, NOW_S - 7200))
    os.utime(orphan, (NOW_S - 7200, NOW_S - 7200))
    os.utime(new_tmp, (NOW_S - 60, NOW_S - 60))
    report = _run(PruneRequest(str(store), max_bytes=0, min_age_s=0))
    assert report["chunks_removed"] == 10
    assert report["tmp_removed"] == 1 and report["orphan_metadata_removed"] == 1
    assert not old_tmp.exists() and not orphan.exists() and new_tmp.exists()
    assert foreign.exists() and outside.exists()
    assert (store / "00" / "link.kvcache.safetensors").is_symlink()


def test_the_budget_cutoff_is_the_minute_that_frees_enough() -> None:
    by_minute = {10: 100, 11: 50, 12: 25}
    assert cutoff_for_budget(by_minute, 175, 200) is None
    assert cutoff_for_budget(by_minute, 175, 100) == 11 * 60  # minute 10 alone frees 100
    assert cutoff_for_budget(by_minute, 175, 60) == 12 * 60
    assert cutoff_for_budget(by_minute, 175, 0) == 13 * 60


def test_sizes_and_durations_as_operators_write_them() -> None:
    assert parse_size_bytes("500G") == 500 * 2**30 == parse_size_bytes("500GiB")
    assert parse_size_bytes("1.5T") == int(1.5 * 2**40) and parse_size_bytes("4096") == 4096
    assert parse_duration_s("7d") == 7 * DAY_S and parse_duration_s("90") == 90.0
    for bad in ("lots", "-5G", "5X"):
        with pytest.raises(ValueError, match="is not a size"):
            parse_size_bytes(bad)
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s("soon")


def test_the_command_reports_exits_and_refuses_bad_input(store: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["gds", "prune", str(store), "--max-bytes", "1G", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["chunks_found"] == 10 and doc["chunks_removed"] == 0 and not doc["over_budget"]
    fresh = _chunk(store, 99, age_s=0)
    for path in (fresh, Path(f"{fresh}.metadata")):
        os.utime(path)  # used just now, by the wall clock
    result = runner.invoke(main, ["gds", "prune", str(store), "--max-bytes", "0"])
    assert result.exit_code == 1  # the fresh chunk was used within the default --min-age
    assert "removed 10 chunks" in result.output and "still over --max-bytes" in result.output
    assert fresh.exists()
    for args, message in (
        ([str(store)], "give --max-bytes SIZE, --max-age DURATION, or both"),
        ([str(store), "--max-bytes", "lots"], "is not a size"),
        ([str(store / "nope"), "--max-age", "1d"], "no such directory"),
    ):
        result = runner.invoke(main, ["gds", "prune", *args])
        assert result.exit_code == 2 and message in result.output, result.output


def test_prune_runs_against_the_real_clock(store: Path) -> None:
    """The chunks above were used long ago by the wall clock: an age limit removes them."""
    assert prune(PruneRequest(str(store), max_age_s=DAY_S)).chunks_removed == 10
