"""LMCache's GDS backend file layout: write stored chunks as files, scan them back at startup.

Layout (`GdsBackend._key_to_path`,
https://github.com/LMCache/LMCache/blob/dev/lmcache/v1/storage_backend/gds_backend.py):
``{gds_path}/{L1}/{L2}/{quote(key_str, safe="")}.kvcache.safetensors`` plus ``.metadata``, where
L1/L2 are the first two pairs of characters of the decimal chunk hash (it may start with "-") and
``key_str`` is ``{model}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}`` (LMCache 0.3.15+).
A data file is a 4096-byte header (``<Q`` length + JSON padded with spaces) followed by the
payload; the ``.metadata`` file is a copy of the header. Both are written to ``<path>.tmp<8hex>``
and renamed, so a reader never sees half a file. The simulator writes a small payload (the KV
bytes are modelled, not materialised); the header's shape and ``data_offsets`` describe that
payload so LMCache-style consistency checks (size - 4096 == data_offsets[1]) hold, and
``__metadata__`` records the modelled chunk size.

Reading back (`unreadable`): before a load the server checks that every rank's data file of each
chunk opens and has its full size, as LMCache's GDS backend reads it (`_load_gds`); a file lost,
truncated or unreadable after it was written is a failed load, logged as LMCache logs it ("GDS
read failed for <path>: <error>") and recomputed. Only chunks this process wrote or found at
start-up are judged: a write still queued behind the model's clock is not a lost file.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

from kvops.sim.hashing import to_signed64

HEADER_BYTES = 4096
DATA_SUFFIX = ".kvcache.safetensors"
META_SUFFIX = DATA_SUFFIX + ".metadata"
PAYLOAD_ELEMENTS = 32  # bf16 elements actually written per file
_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "half": "F16", "float32": "F32"}


@dataclass(frozen=True)
class ChunkKey:
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int  # signed 64-bit, as LMCache's
    dtype: str

    def to_string(self) -> str:
        """`CacheEngineKey.to_string` of LMCache 0.3.15+ (hash in hex, `-` kept for negatives)."""
        return (
            f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash:x}@{self.dtype}"
        )

    def path(self, gds_path: Path) -> Path:
        digits = str(self.chunk_hash)
        return (
            gds_path / digits[:2] / digits[2:4] / (quote(self.to_string(), safe="") + DATA_SUFFIX)
        )


_KEY_RE = re.compile(
    r"^(?P<model>.+)@(?P<ws>\d+)@(?P<wid>\d+)@(?P<hash>-?[0-9a-f]+)@(?P<dtype>[^@]+)"
)


def parse_key(file_name: str) -> ChunkKey | None:
    """The key of a data or metadata file name, or None for anything else (tmp files too)."""
    for suffix in (META_SUFFIX, DATA_SUFFIX):
        if file_name.endswith(suffix):
            match = _KEY_RE.match(unquote(file_name[: -len(suffix)]))
            if match is None:
                return None
            return ChunkKey(
                match["model"], int(match["ws"]), int(match["wid"]), int(match["hash"], 16),
                match["dtype"],
            )  # fmt: skip
    return None


def _header(dtype: str, modelled_bytes: int) -> bytes:
    payload = PAYLOAD_ELEMENTS * 2
    doc = {
        "kvcache": {
            "dtype": _DTYPE_NAMES.get(dtype, "BF16"),
            "shape": [2, 1, PAYLOAD_ELEMENTS // 2],
            "data_offsets": [0, payload],
            "fmt": 1,
            "__metadata__": {
                "lmcache_version": "1",
                "kvops_sim_modelled_bytes": str(modelled_bytes),
            },
        }
    }
    body = json.dumps(doc).encode()
    body = body + b" " * (HEADER_BYTES - 8 - len(body))
    return struct.pack("<Q", len(body)) + body


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp{secrets.token_hex(4)}")
    tmp.write_bytes(data)
    os.rename(tmp, path)


class GdsChunkWriter:
    """Writes chunk files for one model; one file pair per tensor-parallel rank."""

    def __init__(
        self, gds_path: str | Path, model_name: str, world_size: int, dtype: str, chunk_bytes: int
    ) -> None:
        self.root = Path(gds_path)
        self.model_name = model_name
        self.world_size = world_size
        self.dtype = dtype
        self.header = _header(dtype, chunk_bytes // max(1, world_size))
        self.root.mkdir(parents=True, exist_ok=True)
        self._dirs: set[Path] = set()  # created already: a mkdir per file is a wasted syscall
        self.written: set[int] = set()  # chunks (unsigned hashes) whose files are on disk
        self.file_bytes = HEADER_BYTES + PAYLOAD_ELEMENTS * 2

    def write(self, chunk_hashes: list[int]) -> int:
        """Write the given chunks (unsigned model hashes); returns files written."""
        written = 0
        payload = self.header + bytes(PAYLOAD_ELEMENTS * 2)
        for h in chunk_hashes:
            for worker in range(self.world_size):
                key = ChunkKey(self.model_name, self.world_size, worker, to_signed64(h), self.dtype)
                path = key.path(self.root)
                if path.parent not in self._dirs:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    self._dirs.add(path.parent)
                _atomic_write(path, payload)
                _atomic_write(path.with_name(path.name + ".metadata"), self.header)
                written += 2
            self.written.add(h)
        return written

    def has_chunk(self, chunk_hash: int) -> bool:
        """Whether every rank's metadata file of this chunk (unsigned model hash) is on disk
        now: how LMCache's GDS backend finds a chunk another process stored after its start-up
        scan (`contains()` -> `_try_to_read_metadata`, an `os.path.exists` of the `.metadata`
        file). The metadata file is renamed into place after the data file, so its presence
        means the chunk is whole."""
        signed = to_signed64(chunk_hash)
        for worker in range(self.world_size):
            key = ChunkKey(self.model_name, self.world_size, worker, signed, self.dtype)
            path = key.path(self.root)
            if not os.path.exists(path.with_name(path.name + ".metadata")):
                return False
        return True

    def unreadable(self, chunk_hashes: list[int]) -> dict[int, str]:
        """Of the given chunks (unsigned hashes) those written before whose data file, for some
        rank, no longer opens or is short, with "<path>: <error>"."""
        bad: dict[int, str] = {}
        for h in chunk_hashes:
            if h not in self.written:
                continue
            for worker in range(self.world_size):
                key = ChunkKey(self.model_name, self.world_size, worker, to_signed64(h), self.dtype)
                path = key.path(self.root)
                try:
                    with path.open("rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                except OSError as exc:
                    bad[h] = f"{path}: {exc.strerror or exc}"
                    break
                if size < self.file_bytes:
                    bad[h] = f"{path}: {size} of {self.file_bytes} bytes"
                    break
        return bad

    def forget(self, chunk_hashes: list[int]) -> None:
        """Chunks whose files failed a read: judged again only once written again."""
        self.written.difference_update(chunk_hashes)

    def scan(self) -> list[int]:
        """Chunks already on disk for this model and world size (unsigned hashes), found the
        way LMCache's startup scan does: `*.metadata` files in two-character directories.
        A chunk counts only when every rank's file is present."""
        ranks: dict[int, set[int]] = {}
        if not self.root.is_dir():
            return []
        for l1 in self.root.iterdir():
            if len(l1.name) != 2 or not l1.is_dir():
                continue
            for l2 in l1.iterdir():
                if len(l2.name) != 2 or not l2.is_dir():
                    continue
                for f in l2.iterdir():
                    if not f.name.endswith(META_SUFFIX):
                        continue
                    key = parse_key(f.name)
                    if key is None or key.model_name != self.model_name:
                        continue
                    if key.world_size != self.world_size or key.dtype != self.dtype:
                        continue
                    ranks.setdefault(key.chunk_hash % (1 << 64), set()).add(key.worker_id)
        found = sorted(h for h, workers in ranks.items() if len(workers) == self.world_size)
        self.written.update(found)
        return found
