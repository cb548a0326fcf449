"""The storage bench's directories on a store that a fleet shares (kvops/probe/storage.py)."""

from __future__ import annotations

import os
from pathlib import Path

from kvops.probe.storage import STALE_BENCH_AGE_S, make_bench_dir, remove_stale_bench_dirs


def test_only_a_bench_directory_left_long_ago_is_removed(tmp_path: Path) -> None:
    """Another host's bench in progress on the same export keeps its directory; one a killed
    run left an hour ago goes (seen: a fresh directory deleted under a running gdsio)."""
    now = 1_000_000.0
    old = tmp_path / "kvops-gdsio-old111"
    fresh = tmp_path / "kvops-gdsio-new222"
    other = tmp_path / "chunks-of-lmcache"
    for folder in (old, fresh, other):
        folder.mkdir()
    os.utime(old, (now - STALE_BENCH_AGE_S - 1, now - STALE_BENCH_AGE_S - 1))
    os.utime(fresh, (now - 60, now - 60))
    os.utime(other, (now - 10 * STALE_BENCH_AGE_S, now - 10 * STALE_BENCH_AGE_S))
    result = remove_stale_bench_dirs(str(tmp_path), now_s=now)
    assert result == {"stale_removed": [str(old)], "stale_left": []}
    assert fresh.is_dir() and other.is_dir() and not old.exists()


def test_a_second_probe_on_the_same_store_keeps_the_first_ones_bench(tmp_path: Path) -> None:
    """Two hosts' probes bench one export, one after the other starting: the second's set-up
    (stale cleanup, then its own directory) leaves the first's directory where its gdsio runs."""
    first = make_bench_dir(str(tmp_path))
    second = make_bench_dir(str(tmp_path))
    assert second["stale_removed"] == [] and second["stale_left"] == []
    assert Path(first["dir"]).is_dir() and Path(second["dir"]).is_dir()
    assert first["dir"] != second["dir"]
