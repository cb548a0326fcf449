"""A fleet: N engine instances behind a router, their offload tiers sharing one storage export.

Why: one GPU host is the reference experiment, operators run many, and the point of a shared
ONTAP store is that a prefix computed on one instance is loaded by the others. This module runs
the seed scenarios over N instances in virtual time and says how much of what the instances
loaded another instance had stored, how busy the export's nodes were, and whether the fleet's
throughput is set by its GPUs or by the export: the same fleet is run again with an export that
never holds a transfer back, and the difference is what the export's bandwidth costs.

Every instance gets the load one engine gets in `kvops sim run` (the fleet's batch is
`batch_size` x N, closed loop: a batch is sent when the whole fleet has answered the previous
one), so throughput scales with N for as long as nothing shared limits it. Engines step in
virtual-time order (the one whose next step starts first), so what one instance stored has
landed, or not, when another looks it up. Pure: profiles in, figures out.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvops.sim.export import SharedExport
from kvops.sim.hashing import PromptHasher, as_token_array
from kvops.sim.model import Engine, EngineSettings, build_engine
from kvops.sim.profiles import GpuProfile, ModelProfile, StorageProfile
from kvops.sim.records import Request, SimRequestRecord
from kvops.sim.router import PrefixPolicy, Router, make_router
from kvops.sim.seed_workloads import SeedShape, Summary, seed_batches, summarize

# The export limits the fleet when it costs more than this share of the throughput an export
# without limits would give (smaller differences are within the model's own approximations).
EXPORT_LIMIT_PCT = 5.0


@dataclass(frozen=True)
class FleetSetup:
    """What a fleet is made of (profiles as objects, engine settings per arm)."""

    model: ModelProfile
    gpu: GpuProfile
    storage: StorageProfile
    settings: Callable[[bool], EngineSettings]
    router: str = "round-robin"
    policy: PrefixPolicy = field(default_factory=PrefixPolicy)
    seed: int = 0


@dataclass
class Fleet:
    engines: list[Engine]
    router: Router
    export: SharedExport | None
    hasher: PromptHasher


def build_fleet(setup: FleetSetup, instances: int, offload: bool, unlimited: bool = False) -> Fleet:
    """N engines; with offload, their tiers share one export (`unlimited`: without node limits)."""
    settings = setup.settings(offload)
    export = SharedExport(setup.storage, instances, unlimited) if offload else None
    engines = [
        build_engine(setup.model, setup.gpu, setup.storage, settings, export, i)
        for i in range(instances)
    ]
    chunk = settings.lmcache.chunk_size
    router = make_router(setup.router, instances, setup.seed, setup.policy)
    return Fleet(engines, router, export, PromptHasher(settings.block_size, chunk))


@dataclass(frozen=True)
class FleetGroup:
    """Requests released together: `closed`, when every instance has finished the previous
    group, with `arrivals_s` as offsets from that moment; otherwise at those absolute times.
    `make(position, arrival_s)` builds a request only when it is routed (a long trace never
    holds every prompt at once)."""

    arrivals_s: list[float]
    make: Callable[[int, float], Request]
    closed: bool = True


@dataclass
class FleetReplay:
    """(instance, record) of every request simulated, in request order, and those refused."""

    placed: list[tuple[int, SimRequestRecord]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)


def run_fleet_groups(fleet: Fleet, groups: Iterable[FleetGroup]) -> FleetReplay:
    """Route each request when virtual time reaches its arrival, and step the instance whose
    next step starts first, until the group is done."""
    out = FleetReplay()
    engines = fleet.engines
    in_flight = [0] * len(engines)
    for group in groups:
        base_s = max(e.now_s for e in engines) if group.closed else 0.0
        placed: list[tuple[int, str]] = []
        done: dict[str, SimRequestRecord] = {}
        pending = deque(enumerate(group.arrivals_s))
        while True:
            busy = [(e.next_step_start_s(), i) for i, e in enumerate(engines) if e.has_work()]
            t_next = min(busy) if busy else None
            if pending and (t_next is None or base_s + pending[0][1] <= t_next[0]):
                position, offset_s = pending.popleft()
                req = group.make(position, base_s + offset_s)
                chunks = fleet.hasher(as_token_array(req.prompt_tokens))[1]
                i = fleet.router.choose(chunks, in_flight)
                try:
                    engines[i].add_request(req)
                except ValueError as exc:  # longer than the context or the KV pool
                    out.rejected.append(f"{req.request_id}: {exc}")
                    continue
                in_flight[i] += 1
                placed.append((i, req.request_id))
                continue
            if t_next is None:
                break
            i = t_next[1]
            step = engines[i].step()
            if step is not None:
                in_flight[i] -= len(step.finished)
                done.update((rec.request_id, rec) for rec in step.finished)
        out.placed.extend((i, done[rid]) for i, rid in placed)
    return out


def run_fleet_batches(
    fleet: Fleet, batches: Iterable[list[Request]], send_interval_s: float = 0.0
) -> list[tuple[int, SimRequestRecord]]:
    """Closed loop over the fleet: each batch is sent when every instance has finished the
    previous one, its requests `send_interval_s` apart. Returns (instance, record) in request
    order."""

    def group(batch: list[Request]) -> FleetGroup:
        def make(position: int, arrival_s: float) -> Request:
            req = batch[position]
            req.arrival_s = arrival_s
            return req

        return FleetGroup([k * send_interval_s for k in range(len(batch))], make)

    return run_fleet_groups(fleet, (group(b) for b in batches)).placed


@dataclass(frozen=True)
class InstanceFigures:
    instance: int
    requests: int
    summary: Summary
    read_gb: float
    write_gb: float
    loaded_chunks: int
    cross_instance_chunks: int
    export_wait_s: float
    link_read_busy: float  # share of the run this host's link spent reading
    link_write_busy: float

    @property
    def cross_instance_hit_share(self) -> float:
        return self.cross_instance_chunks / self.loaded_chunks if self.loaded_chunks else 0.0


@dataclass(frozen=True)
class FleetRun:
    """One arm over the fleet: the fleet's figures, each instance's, and the export's."""

    instances: int
    fleet: Summary
    per_instance: list[InstanceFigures]
    node_busy: dict[str, float]  # node{k}_{read|write}: share of the run (0 without offload)
    duration_s: float

    @property
    def loaded_chunks(self) -> int:
        return sum(p.loaded_chunks for p in self.per_instance)

    @property
    def cross_instance_chunks(self) -> int:
        return sum(p.cross_instance_chunks for p in self.per_instance)

    @property
    def cross_instance_hit_share(self) -> float:
        n = self.loaded_chunks
        return self.cross_instance_chunks / n if n else 0.0

    @property
    def read_gb(self) -> float:
        return sum(p.read_gb for p in self.per_instance)


def run_arm(
    setup: FleetSetup,
    scenario: str,
    shape: SeedShape,
    instances: int,
    offload: bool,
    skip_iterations: int = 1,
    unlimited: bool = False,
) -> FleetRun:
    """The scenario over `instances` engines, each with one engine's share of the load."""
    fleet = build_fleet(setup, instances, offload, unlimited)
    fleet_shape = dataclasses.replace(shape, batch_size=shape.batch_size * instances)
    placed = run_fleet_batches(fleet, seed_batches(scenario, fleet_shape), shape.send_interval_s)
    return measure(fleet, placed[skip_iterations * fleet_shape.batch_size :], setup.storage)


def measure(
    fleet: Fleet, measured: list[tuple[int, SimRequestRecord]], storage: StorageProfile
) -> FleetRun:
    """The fleet's figures over the `measured` records, each instance's, and the export's (its
    traffic over the whole run, warm-up included)."""
    instances = len(fleet.engines)
    fleet_summary = summarize([rec for _, rec in measured])
    end_s = max(e.now_s for e in fleet.engines)
    export = fleet.export
    per: list[InstanceFigures] = []
    for i in range(instances):
        mine = [rec for j, rec in measured if j == i]
        io = export.io[i] if export is not None else None
        read_b = io.read_bytes if io else 0.0
        write_b = io.write_bytes if io else 0.0
        per.append(
            InstanceFigures(
                instance=i,
                requests=len(mine),
                summary=summarize(mine) if mine else Summary(0.0, 0.0, 0.0, 0, 0),
                read_gb=read_b / 1e9,
                write_gb=write_b / 1e9,
                loaded_chunks=io.loaded_chunks if io else 0,
                cross_instance_chunks=io.cross_instance_chunks if io else 0,
                export_wait_s=io.export_wait_s if io else 0.0,
                link_read_busy=_busy(read_b, storage.read_bandwidth_gb_s, end_s),
                link_write_busy=_busy(write_b, storage.write_bandwidth_gb_s, end_s),
            )
        )
    nodes = export.utilisation(end_s) if export is not None else {}
    return FleetRun(instances, fleet_summary, per, nodes, end_s)


def _busy(nbytes: float, bandwidth_gb_s: float, duration_s: float) -> float:
    return nbytes / (bandwidth_gb_s * 1e9 * duration_s) if duration_s > 0 else 0.0


@dataclass(frozen=True)
class FleetPoint:
    """Both arms at one fleet size, and the offload arm again with an export without limits."""

    instances: int
    baseline: FleetRun
    offload: FleetRun
    unlimited: FleetRun

    @property
    def export_cost_pct(self) -> float:
        """Throughput the export's bandwidth costs: how far below an export without limits."""
        free = self.unlimited.fleet.total_token_throughput_tok_s
        real = self.offload.fleet.total_token_throughput_tok_s
        return (1.0 - real / free) * 100.0 if free > 0 else 0.0

    @property
    def export_limited(self) -> bool:
        return self.export_cost_pct > EXPORT_LIMIT_PCT

    @property
    def offload_gain_pct(self) -> float:
        b = self.baseline.fleet.total_token_throughput_tok_s
        return (self.offload.fleet.total_token_throughput_tok_s / b - 1.0) * 100.0 if b else 0.0


def run_points(
    setup: FleetSetup,
    scenario: str,
    shape: SeedShape,
    sizes: Iterable[int],
    skip_iterations: int = 1,
) -> list[FleetPoint]:
    """Each fleet size through the baseline, the offload arm, and the offload arm with an
    export without limits."""
    points = []
    for n in sizes:
        runs = [
            run_arm(setup, scenario, shape, n, offload, skip_iterations, unlimited)
            for offload, unlimited in ((False, False), (True, False), (True, True))
        ]
        points.append(FleetPoint(n, *runs))
    return points


@dataclass(frozen=True)
class ExportBounds:
    """Closed-form bounds on the fleet size the export carries, from what one fleet asks of it
    (its run on an export without limits, so the demand is not already held back):
    `all_at_once` instances when every host reads at its link's full rate at the same time
    (closed-loop batches start together), `on_average` instances at the mean read and write
    rates. The export starts to limit somewhere between."""

    read_capacity_gb_s: float
    write_capacity_gb_s: float
    mean_read_gb_s_per_instance: float
    mean_write_gb_s_per_instance: float
    all_at_once: float
    on_average: float


def export_bounds(storage: StorageProfile, run: FleetRun) -> ExportBounds | None:
    nodes = storage.export_nodes
    node_read, node_write = storage.node_read_bandwidth_gb_s, storage.node_write_bandwidth_gb_s
    if nodes is None or node_read is None or node_write is None or run.duration_s <= 0:
        return None
    read_cap, write_cap = nodes * node_read, nodes * node_write
    n = run.instances
    read_rate = run.read_gb / run.duration_s / n
    write_rate = sum(p.write_gb for p in run.per_instance) / run.duration_s / n
    burst = min(read_cap / storage.read_bandwidth_gb_s, write_cap / storage.write_bandwidth_gb_s)
    demands = [cap / rate for cap, rate in ((read_cap, read_rate), (write_cap, write_rate)) if rate]
    return ExportBounds(
        read_cap, write_cap, read_rate, write_rate, burst, min(demands) if demands else float("inf")
    )


@dataclass(frozen=True)
class LimitProbe:
    """The offload arm at one larger fleet size, on the export and on one without limits."""

    instances: int
    export_cost_pct: float

    @property
    def export_limited(self) -> bool:
        return self.export_cost_pct > EXPORT_LIMIT_PCT


def probe_export_limit(
    setup: FleetSetup,
    scenario: str,
    shape: SeedShape,
    points: list[FleetPoint],
    skip_iterations: int = 1,
    max_instances: int = 64,
) -> list[LimitProbe]:
    """When no simulated point is export-limited, double the largest fleet until one is, or
    until the closed-form mean-demand bound (past it the export cannot keep up on average, so it
    limits by then) or `max_instances` is passed. Empty when a point already is limited."""
    if not points or any(p.export_limited for p in points):
        return []
    bounds = export_bounds(setup.storage, points[-1].unlimited)
    ceiling = min(max_instances, bounds.on_average if bounds else max_instances)
    probes: list[LimitProbe] = []
    n = points[-1].instances * 2
    while n <= ceiling:
        real = run_arm(setup, scenario, shape, n, True, skip_iterations)
        free = run_arm(setup, scenario, shape, n, True, skip_iterations, unlimited=True)
        f = free.fleet.total_token_throughput_tok_s
        cost = (1.0 - real.fleet.total_token_throughput_tok_s / f) * 100.0 if f > 0 else 0.0
        probes.append(LimitProbe(n, cost))
        if probes[-1].export_limited:
            break
        n *= 2
    return probes
