"""`kvops gds prune`: keep an LMCache GDS directory under a byte budget or an age, while the
engines that write and read it stay up.

Why kvops does it: LMCache's GDS backend never evicts (LMCache issue #1724; its eviction PR
#2217 was closed unmerged) and a shared store on ONTAP fills until the volume is full
(LMCache #4664). What a safe pruner must respect, from LMCache 0.5.6
`lmcache/v1/storage_backend/gds_backend.py`:

- A chunk is two files: `<h[:2]>/<h[2:4]>/<key>.kvcache.safetensors` (4096-byte header + KV)
  and `<same>.metadata`. Both are written as `<name>.tmp<8 hex>` and renamed; the metadata is
  renamed after the data, and a reader (another host's on-miss probe, or any engine's start-up
  scan) finds a chunk through its metadata.
- So the metadata goes first, then the data: an engine that has not indexed the chunk can no
  longer find it; one that has fails that one load and, with vLLM's
  `kv_load_failure_policy: recompute` (the role's setting), recomputes — no request fails.
- Temporary files are writes in flight: removed only when older than `tmp_age_s` (a write
  takes milliseconds to seconds), as are metadata files whose data file is gone.
- Nothing else is touched: no other file name, no symlink followed, no directory removed.

Least recently used is read from each data file's atime, or its mtime where that is later
(NFS clients mounted `relatime` or `noatime` update atime rarely or never: then this is least
recently *written*, which the README says).

Memory does not grow with the number of files: the walk holds one directory iterator per
level, and the byte budget is met in two passes — the first sums bytes per minute of last use
(a histogram, bounded by the span of times, not the file count), which gives the cut-off
minute; the second removes what is older. A million chunks cost two directory walks.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

DATA_SUFFIX = ".kvcache.safetensors"
META_SUFFIX = DATA_SUFFIX + ".metadata"
_TMP = re.compile(r"\.kvcache\.safetensors(?:\.metadata)?\.tmp[0-9a-f]{8}$")
BUCKET_S = 60


@dataclass(frozen=True)
class PruneRequest:
    """What to keep: at most `max_bytes` of chunks, and none unused for longer than
    `max_age_s` (either or both). Chunks used in the last `min_age_s` are never removed (a
    chunk just written is likely read again at once)."""

    directory: str
    max_bytes: int | None = None
    max_age_s: float | None = None
    min_age_s: float = 300.0
    tmp_age_s: float = 3600.0
    dry_run: bool = False


@dataclass
class PruneReport:
    """What was found and what was (or, with --dry-run, would be) removed."""

    directory: str
    dry_run: bool
    chunks_found: int = 0
    bytes_found: int = 0
    chunks_removed: int = 0
    bytes_freed: int = 0
    tmp_removed: int = 0
    orphans_removed: int = 0
    cutoff_unix_s: float | None = None
    errors: list[str] = field(default_factory=list)
    error_count: int = 0

    @property
    def bytes_left(self) -> int:
        return self.bytes_found - self.bytes_freed

    def to_dict(self) -> dict[str, object]:
        return {
            "directory": self.directory,
            "dry_run": self.dry_run,
            "chunks_found": self.chunks_found,
            "bytes_found": self.bytes_found,
            "chunks_removed": self.chunks_removed,
            "bytes_freed": self.bytes_freed,
            "bytes_left": self.bytes_left,
            "tmp_removed": self.tmp_removed,
            "orphan_metadata_removed": self.orphans_removed,
            "cutoff_unix_s": self.cutoff_unix_s,
            "errors": self.errors,
            "error_count": self.error_count,
        }


@dataclass(frozen=True)
class Chunk:
    data_path: str
    size_bytes: int  # data + metadata
    used_unix_s: float


MAX_ERRORS_KEPT = 20


def _walk_files(top: str, on_error: Callable[[str], None]) -> Iterator[os.DirEntry[str]]:
    """Every regular file below `top`, never following a symlink; one scandir iterator per
    directory level is all that is held."""
    stack = [top]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        yield entry
        except OSError as exc:
            on_error(f"cannot list {path}: {exc.strerror}")


def _chunk(entry: os.DirEntry[str]) -> Chunk:
    st = entry.stat(follow_symlinks=False)
    meta_bytes = 0
    try:
        meta = os.lstat(entry.path + ".metadata")
        if stat.S_ISREG(meta.st_mode):
            meta_bytes = meta.st_size
    except OSError:
        pass
    return Chunk(entry.path, st.st_size + meta_bytes, max(st.st_atime, st.st_mtime))


def cutoff_for_budget(
    bytes_by_minute: dict[int, int], total_bytes: int, max_bytes: int
) -> float | None:
    """The oldest minute of last use to keep so that what is kept fits `max_bytes`: removing
    every chunk last used before the returned instant (unix seconds) frees enough, or None
    when nothing needs to go. Pure."""
    excess = total_bytes - max_bytes
    if excess <= 0:
        return None
    freed = 0
    for minute in sorted(bytes_by_minute):
        freed += bytes_by_minute[minute]
        if freed >= excess:
            return float((minute + 1) * BUCKET_S)
    return float((max(bytes_by_minute) + 1) * BUCKET_S) if bytes_by_minute else None


class Pruner:
    """Runs one `PruneRequest`. `progress(files_seen)` is called every `progress_every` files."""

    def __init__(
        self,
        req: PruneRequest,
        progress: Callable[[int], None] = lambda seen: None,
        progress_every: int = 10_000,
        now_s: Callable[[], float] = time.time,
    ) -> None:
        self.req = req
        self.progress = progress
        self.progress_every = progress_every
        self.now_s = now_s
        self.report = PruneReport(req.directory, req.dry_run)

    def _error(self, message: str) -> None:
        self.report.error_count += 1
        if len(self.report.errors) < MAX_ERRORS_KEPT:
            self.report.errors.append(message)

    def _files(self) -> Iterator[os.DirEntry[str]]:
        for seen, entry in enumerate(_walk_files(self.req.directory, self._error), 1):
            if seen % self.progress_every == 0:
                self.progress(seen)
            yield entry

    def run(self) -> PruneReport:
        now = self.now_s()
        cutoff = now - self.req.max_age_s if self.req.max_age_s is not None else None
        counted = self.req.max_bytes is not None  # the budget's pass counts what is there
        if self.req.max_bytes is not None:
            by_minute, total, chunks = self._histogram()
            self.report.bytes_found, self.report.chunks_found = total, chunks
            budget_cutoff = cutoff_for_budget(by_minute, total, self.req.max_bytes)
            if budget_cutoff is not None:
                cutoff = budget_cutoff if cutoff is None else max(cutoff, budget_cutoff)
        if cutoff is not None:
            cutoff = min(cutoff, now - self.req.min_age_s)
        self.report.cutoff_unix_s = cutoff
        self._remove(cutoff, now, count_found=not counted)
        return self.report

    def _histogram(self) -> tuple[dict[int, int], int, int]:
        by_minute: dict[int, int] = {}
        total = chunks = 0
        for entry in self._files():
            if not entry.name.endswith(DATA_SUFFIX):
                continue
            try:
                chunk = _chunk(entry)
            except OSError:
                continue  # gone meanwhile (another pruner, or a rewrite): not counted
            minute = int(chunk.used_unix_s // BUCKET_S)
            by_minute[minute] = by_minute.get(minute, 0) + chunk.size_bytes
            total += chunk.size_bytes
            chunks += 1
        return by_minute, total, chunks

    def _remove(self, cutoff: float | None, now: float, count_found: bool) -> None:
        report = self.report
        for entry in self._files():
            name = entry.name
            try:
                if name.endswith(DATA_SUFFIX):
                    chunk = _chunk(entry)
                    if count_found:
                        report.chunks_found += 1
                        report.bytes_found += chunk.size_bytes
                    if cutoff is not None and chunk.used_unix_s < cutoff:
                        self._unlink(chunk.data_path + ".metadata", missing_ok=True)
                        self._unlink(chunk.data_path)
                        report.chunks_removed += 1
                        report.bytes_freed += chunk.size_bytes
                elif _TMP.search(name):
                    if entry.stat(follow_symlinks=False).st_mtime < now - self.req.tmp_age_s:
                        self._unlink(entry.path)
                        report.tmp_removed += 1
                elif name.endswith(META_SUFFIX):
                    data = entry.path[: -len(".metadata")]
                    old = entry.stat(follow_symlinks=False).st_mtime < now - self.req.tmp_age_s
                    if old and not os.path.lexists(data):
                        self._unlink(entry.path)
                        report.orphans_removed += 1
            except FileNotFoundError:
                continue  # removed meanwhile: what we wanted
            except OSError as exc:
                self._error(f"{entry.path}: {exc.strerror}")

    def _unlink(self, path: str, missing_ok: bool = False) -> None:
        if self.req.dry_run:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise


def prune(req: PruneRequest, progress: Callable[[int], None] = lambda seen: None) -> PruneReport:
    """Prune `req.directory` as asked; see the module docstring for what is safe and why."""
    return Pruner(req, progress).run()
