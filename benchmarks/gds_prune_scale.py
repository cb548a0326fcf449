"""`kvops gds prune` on a million chunks: peak memory and time, against references measured in
the same run.

A GDS directory in LMCache 0.5.6's layout (`<h[:2]>/<h[2:4]>/<key>.kvcache.safetensors` plus
`.metadata`; empty files, each chunk's times spread over 30 days) is built once under a
temporary directory, then, each in a fresh child process:

- reference memory: the same interpreter with kvops.gds.prune imported, pruning nothing;
- reference time: a bare walk of the same tree (os.scandir, stat of every file), the least any
  pruner must do;
- `--max-bytes` at half the directory (two walks + removals of half the chunks),
  then `--max-age 7d` (one walk) on what is left.

Printed: peak RSS of each prune as a ratio to the reference, and its time as a ratio to the
bare walk. The memory budget kvops states: the prune's peak RSS stays within the reference
plus 64 MiB whatever the file count (it holds one scandir iterator per directory level and a
histogram of last-use minutes, never the file list).

    python benchmarks/gds_prune_scale.py [--chunks 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAY_S = 86400

CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, {root!r})
from kvops.gds.prune import PruneRequest, prune
mode, directory, arg = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.monotonic()
out = {{}}
if mode == "walk":
    files = 0
    stack = [directory]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    e.stat(follow_symlinks=False); files += 1
    out["files"] = files
elif mode == "bytes":
    out = prune(PruneRequest(directory, max_bytes=int(arg), min_age_s=0)).to_dict()
elif mode == "age":
    out = prune(PruneRequest(directory, max_age_s=float(arg), min_age_s=0)).to_dict()
out["seconds"] = time.monotonic() - start
out["peak_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
"""


def build(directory: Path, chunks: int) -> None:
    """Empty chunk files with sizes given by sparse truncation (1 MiB each: only the size
    counts), last used from now back to 30 days ago."""
    now = time.time()
    for n in range(chunks):
        h = f"{n * 7919 % 10**8:08d}"
        sub = directory / h[:2] / h[2:4]
        if n % 10000 == 0:
            print(f"  building: {n:,} / {chunks:,} chunks", file=sys.stderr)
        sub.mkdir(parents=True, exist_ok=True)
        data = sub / f"bench@1@0@{n:x}@bfloat16.kvcache.safetensors"
        with open(data, "wb") as fh:
            fh.truncate(1 << 20)
        meta = Path(f"{data}.metadata")
        meta.touch()
        used = now - (n % 30) * DAY_S - n % 86400
        os.utime(data, (used, used))
        os.utime(meta, (used, used))


def child(mode: str, directory: Path, arg: str = "0") -> dict[str, float]:
    program = CHILD.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", program, mode, str(directory), arg],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="build the tree here and keep it")
    args = parser.parse_args()
    top = args.keep or Path(tempfile.mkdtemp(prefix="kvops-prune-bench-"))
    directory = top / "gds"
    try:
        t0 = time.monotonic()
        build(directory, args.chunks)
        print(f"built {args.chunks:,} chunks in {time.monotonic() - t0:.0f} s")
        (top / "empty").mkdir(exist_ok=True)
        reference = child("age", top / "empty", str(DAY_S))
        walk = child("walk", directory)
        half = args.chunks * (1 << 20) // 2
        by_bytes = child("bytes", directory, str(half))
        by_age = child("age", directory, str(7 * DAY_S))
        base_kib = reference["peak_rss_kib"]
        for name, run in (("--max-bytes (half)", by_bytes), ("--max-age 7d", by_age)):
            extra_mib = (run["peak_rss_kib"] - base_kib) / 1024
            print(
                f"{name:20s} removed {int(run['chunks_removed']):>9,} of "
                f"{int(run['chunks_found']):>9,} chunks in {run['seconds']:6.1f} s "
                f"({run['seconds'] / walk['seconds']:.2f}x a bare walk of "
                f"{int(walk['files']):,} files, {walk['seconds']:.1f} s); peak RSS "
                f"{run['peak_rss_kib'] / 1024:.0f} MiB = {run['peak_rss_kib'] / base_kib:.2f}x "
                f"the reference ({base_kib / 1024:.0f} MiB), {extra_mib:+.1f} MiB "
                f"[budget: +64 MiB: {'within' if extra_mib <= 64 else 'OVER'}]"
            )
    finally:
        if args.keep is None:
            shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
