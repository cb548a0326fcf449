"""The storage export several engine instances share: one chunk index, and one bandwidth budget
per storage node that every host's loads and stores draw on.

Why: the payoff of KV cache on a shared ONTAP export rather than local disk or DRAM is that a
prefix one vLLM instance computed is a hit for every other (LMCache's GDS backend finds a chunk
file another process stored when it misses in memory); the price is that all instances' reads
and writes go through the same storage nodes. One engine's model (`offload.py`) charges each
transfer its host link's time; a fleet also queues on the export's nodes, and past some number
of instances the nodes, not the GPUs, set the pace.

Model: each host keeps its own link (the storage profile's read/write figures, as for one
engine). The export has `export_nodes` nodes, each with `node_read_bandwidth_gb_s` and
`node_write_bandwidth_gb_s`; a chunk file lives on one node (chosen by its hash: a FlexGroup
spreads files over constituents on every node). Node capacity is booked in short time bins: a
transfer takes, bin by bin from its start, what its link can carry and the node has left, so
transfers the simulation issues slightly out of time order (engines step one after another)
still share a node fairly rather than queueing behind each other's future. A transfer the nodes
never held back finishes exactly when its link alone would have finished it, so a fleet with an
export fast enough behaves as that many independent engines plus a shared index.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvops.errors import KvopsError
from kvops.sim.profiles import StorageProfile

# Width of one booking bin, virtual seconds: far below one chunk transfer at full scale (a
# 256-token chunk of Llama-3.1-8B is 33.5 MB, 1.6 ms at 21 GB/s) yet few bins per load.
BIN_S = 1e-3


class ExportError(KvopsError, ValueError):
    """A storage profile that describes no shared export (e.g. a local drive)."""


@dataclass
class NodeBudget:
    """One storage node's bandwidth in one direction, booked per time bin."""

    name: str
    bandwidth_gb_s: float
    used_bytes: dict[int, float] = field(default_factory=dict)
    total_bytes: float = 0.0

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.bandwidth_gb_s)

    def book(self, start_s: float, nbytes: float, link_bytes_s: float) -> tuple[float, bool]:
        """Move `nbytes` from `start_s` at most at `link_bytes_s`, in whatever this node has left
        in each bin. Returns (finish time, whether the node held the transfer back)."""
        self.total_bytes += nbytes
        if self.unlimited or nbytes <= 0:
            return start_s + nbytes / link_bytes_s, False
        per_bin = self.bandwidth_gb_s * 1e9 * BIN_S
        used = self.used_bytes
        remaining = nbytes
        t = start_s
        held = False
        b = int(t // BIN_S)
        while True:
            span = (b + 1) * BIN_S - t
            room = per_bin - used.get(b, 0.0)
            want = min(remaining, link_bytes_s * span)
            if room < want:
                held = True
            take = min(want, max(0.0, room))
            if take > 0:
                used[b] = used.get(b, 0.0) + take
                remaining -= take
            if remaining <= 0:
                return t + take / link_bytes_s, held
            b += 1
            t = b * BIN_S

    def busy_share(self, duration_s: float) -> float:
        """Utilisation over a run: bytes moved / what the node could move in `duration_s`."""
        if self.unlimited or duration_s <= 0:
            return 0.0
        return self.total_bytes / (self.bandwidth_gb_s * 1e9 * duration_s)


@dataclass
class InstanceIo:
    """One instance's traffic through the export (bytes, chunks, seconds)."""

    read_bytes: float = 0.0
    write_bytes: float = 0.0
    loaded_chunks: int = 0
    cross_instance_chunks: int = 0  # loaded chunks another instance stored
    export_wait_s: float = 0.0  # load time added by the nodes beyond the host link's own


class SharedExport:
    """The index and the node budgets the offload tiers of a fleet share (`OffloadTier(...,
    export=..., instance=i)`). `unlimited` lifts the nodes' limits: the same fleet with an export
    that never holds anything back, to tell GPU-bound from export-bound."""

    def __init__(self, storage: StorageProfile, instances: int, unlimited: bool = False) -> None:
        nodes = storage.export_nodes
        read, write = storage.node_read_bandwidth_gb_s, storage.node_write_bandwidth_gb_s
        if nodes is None or read is None or write is None:
            raise ExportError(
                f"storage profile '{storage.name}' describes no shared export: give "
                "export_nodes, node_read_bandwidth_gb_s and node_write_bandwidth_gb_s"
            )
        if storage.capacity_gb is not None:
            raise ExportError(
                f"storage profile '{storage.name}': a shared export is modelled as LMCache's GDS "
                "backend, which never evicts (capacity_gb must be null)"
            )
        self.storage = storage
        self.instances = instances
        self.unlimited = unlimited
        inf = math.inf
        self.read_nodes = [NodeBudget(f"node{k}", inf if unlimited else read) for k in range(nodes)]
        self.write_nodes = [
            NodeBudget(f"node{k}", inf if unlimited else write) for k in range(nodes)
        ]
        self.io = [InstanceIo() for _ in range(instances)]
        # The index every instance sees: chunks whose files have landed, and who wrote each.
        self.landed: dict[int, None] = {}
        self.readable: dict[int, int] = {}
        self.writer: dict[int, int] = {}
        self.in_flight: list[tuple[float, int, int, list[int]]] = []  # (ready, seq, writer, hashes)
        self.seq = 0
        self.epoch = 0

    def node_of(self, chunk_hash: int) -> int:
        return chunk_hash % len(self.read_nodes)

    def _split(self, hashes: Iterable[int]) -> list[int]:
        counts = [0] * len(self.read_nodes)
        for h in hashes:
            counts[self.node_of(h)] += 1
        return counts

    def transfer(
        self,
        budgets: list[NodeBudget],
        hashes: list[int],
        nbytes: float,
        start_s: float,
        link_s: float,
    ) -> float:
        """Extra seconds the nodes add to a transfer of `nbytes` in chunk files `hashes` that its
        link alone moves in `link_s` from `start_s` (0.0 exactly when no node held it back)."""
        counts = self._split(hashes)
        total = sum(counts)
        if total == 0 or link_s <= 0:
            return 0.0
        link_bytes_s = nbytes / link_s
        finish = start_s
        held = False
        for budget, count in zip(budgets, counts, strict=True):
            if not count:
                continue
            share = nbytes * count / total
            # the link's rate splits over the nodes in proportion, so unhindered parts end together
            done, node_held = budget.book(start_s, share, link_bytes_s * count / total)
            finish = max(finish, done)
            held = held or node_held
        return max(0.0, finish - (start_s + link_s)) if held else 0.0

    def land(self, now_s: float) -> None:
        """Writes finished by `now_s` become readable by every instance."""
        heap = self.in_flight
        while heap and heap[0][0] <= now_s:
            _, _, writer, hashes = heapq.heappop(heap)
            self.epoch += 1
            for h in hashes:
                if h not in self.landed:
                    self.readable[h] = 1
                    self.landed[h] = None
                    self.writer[h] = writer

    def utilisation(self, duration_s: float) -> dict[str, float]:
        """Busy share of every node, read and write, over `duration_s`."""
        out: dict[str, float] = {}
        for kind, budgets in (("read", self.read_nodes), ("write", self.write_nodes)):
            for budget in budgets:
                out[f"{budget.name}_{kind}"] = budget.busy_share(duration_s)
        return out
