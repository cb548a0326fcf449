"""Prefix hashes: the remembering `PromptHasher` gives exactly what hashing from scratch gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.sim.hashing import PromptHasher, as_token_array, prefix_hashes


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    sizes=st.sampled_from([(16, 256), (16, 16), (4, 6), (32, 8)]),
    capacity=st.integers(1, 4),
)
def test_remembered_prefixes_hash_as_from_scratch(
    seed: int, sizes: tuple[int, int], capacity: int
) -> None:
    block, chunk = sizes
    rng = np.random.default_rng(seed)
    hasher = PromptHasher(block, chunk, capacity=capacity)
    bases = [rng.integers(0, 50, int(rng.integers(0, 700))) for _ in range(3)]
    for _ in range(12):
        base = bases[int(rng.integers(len(bases)))]
        cut = int(rng.integers(0, base.shape[0] + 1))
        tail = rng.integers(0, 50, int(rng.integers(0, 300)))
        tokens = as_token_array(np.concatenate((base[:cut], tail)))
        blocks, chunks = hasher(tokens)
        want_blocks, want_chunks = prefix_hashes(tokens, block, chunk)
        assert blocks.tolist() == want_blocks
        assert chunks == want_chunks
        assert not blocks.flags.writeable  # shared with later prompts


def test_a_reused_token_buffer_is_not_trusted() -> None:
    hasher = PromptHasher(16, 256)
    buf = np.arange(1000, dtype=np.int64)
    hasher(buf)
    buf[500] = -1  # the caller reuses its buffer for the next prompt
    assert hasher(buf)[0].tolist() == prefix_hashes(buf, 16, 256)[0]
