"""Prefix hashes for KV blocks (vLLM) and KV chunks (LMCache), vectorised with numpy.

vLLM and LMCache both identify a full block/chunk by a hash chained over every token before its
end, so equal hashes mean equal prefixes. Chaining block by block in Python costs about a
microsecond per block, too slow for 10,000 requests of 30K tokens; instead each token is mixed
with its position (splitmix64), a running uint64 sum identifies the prefix up to each token, and
the value at a block's or chunk's last token, mixed once more with a salt, is its hash. Numpy's
uint64 arithmetic wraps, which is what we want. The hashes are deterministic across processes
(no Python `hash()`), so chunks written to a GDS directory by one run hit in the next.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

U64 = np.uint64
_GOLDEN = U64(0x9E3779B97F4A7C15)
_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)
BLOCK_SALT = U64(0x5BD1E9955BD1E995)
CHUNK_SALT = U64(0xC2B2AE3D27D4EB4F)

TokenArray = npt.NDArray[np.int64]


def as_token_array(tokens: Sequence[int] | npt.NDArray[np.integer]) -> TokenArray:
    """Prompt tokens as an int64 array (no copy when it already is one)."""
    return np.asarray(tokens, dtype=np.int64)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 finaliser: a cheap, well-spread bijection on uint64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> U64(30))) * _M1
        x = (x ^ (x >> U64(27))) * _M2
        return x ^ (x >> U64(31))


_position_salts: npt.NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)


def _positions(n: int) -> npt.NDArray[np.uint64]:
    """A well-mixed constant per position, computed once and grown on demand."""
    global _position_salts
    if _position_salts.shape[0] < n:
        size = max(n, 2 * _position_salts.shape[0], 1 << 16)
        _position_salts = _mix(np.arange(1, size + 1, dtype=np.uint64))
    return _position_salts[:n]


def prefix_hashes(
    tokens: TokenArray, block_size: int, chunk_size: int
) -> tuple[list[int], list[int]]:
    """Hashes of every full block (vLLM) and every full chunk (LMCache) of a prompt.

    Each token is tagged with its position and mixed once (xorshift-multiply); the running sum
    of these values at a boundary identifies the prefix before it. Only boundary sums are
    needed, so tokens are summed per `gcd(block, chunk)`-token group (a vectorised reduction)
    and only the group sums are accumulated; a final mix per boundary spreads the hashes.
    Costs ~0.1 ms for a 30K-token prompt."""
    unit = math.gcd(block_size, chunk_size)
    groups = tokens.shape[0] // unit
    if groups == 0:
        return [], []
    with np.errstate(over="ignore"):
        x = tokens[: groups * unit].astype(np.uint64) * _GOLDEN
        x += _positions(x.shape[0])
        x ^= x >> U64(29)
        x *= _M1
        starts = np.arange(0, groups * unit, unit)
        # reduceat is ~10x faster here than reshape(...).sum(axis=1) on short rows
        sums = np.cumsum(np.add.reduceat(x, starts), dtype=np.uint64)
    return _boundaries(sums, block_size // unit, BLOCK_SALT), _boundaries(
        sums, chunk_size // unit, CHUNK_SALT
    )


def _boundaries(sums: npt.NDArray[np.uint64], stride: int, salt: np.uint64) -> list[int]:
    """Hashes at every `stride`-th group boundary, as Python ints (dict keys)."""
    full = sums.shape[0] // stride
    if full == 0:
        return []
    hashes: list[int] = _mix(sums[stride - 1 : full * stride : stride] ^ salt).tolist()
    return hashes


def to_signed64(value: int) -> int:
    """LMCache chunk hashes are Python ints from `hash()`, signed 64-bit; mirror that range."""
    return value - (1 << 64) if value >= (1 << 63) else value
