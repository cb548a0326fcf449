"""`kvops advise --instances N`: the same traffic over N instances sharing one storage export.

Why: an operator's trace is what the front door saw, and it will be spread over several
instances. Whether offload pays then depends on the router (a prefix-aware router keeps a
prefix in one instance's GPU cache; round-robin makes every instance need every prefix, and the
shared store serves what another instance computed) and on whether the export keeps up with
all instances at once. This replays the workload's first `sample_requests` requests through a
baseline fleet, an offload fleet on the export, and the offload fleet on an export without
limits (`kvops.sim.fleet`), and reports the cross-instance hit share, the export's load and the
bottleneck, beside the single-instance advice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvops.advise.analysis import AdviseOptions, sample
from kvops.advise.arms import Profiles
from kvops.advise.workload import Group, PromptBuilder, TraceRequest, Workload
from kvops.sim.fleet import (
    Fleet,
    FleetGroup,
    FleetPoint,
    FleetRun,
    FleetSetup,
    build_fleet,
    measure,
    run_fleet_groups,
)
from kvops.sim.fleet_report import bottleneck, verdict_line
from kvops.sim.profiles import StorageProfile
from kvops.sim.records import Request


def with_export(measured: StorageProfile, named: StorageProfile) -> StorageProfile:
    """A host link measured by gdsio (`--storage-from-evidence`) with the export's node figures
    of the named profile: one host's bench says nothing of what the nodes serve to many."""
    return dataclasses.replace(
        measured,
        export_nodes=named.export_nodes,
        node_read_bandwidth_gb_s=named.node_read_bandwidth_gb_s,
        node_write_bandwidth_gb_s=named.node_write_bandwidth_gb_s,
    )


@dataclass(frozen=True)
class FleetAdvice:
    instances: int
    router: str
    requests: int  # replayed (the workload's first `sample_requests`)
    rejected: int
    point: FleetPoint


def _groups(groups: list[Group], builder: PromptBuilder, max_len: int) -> list[FleetGroup]:
    out = []
    for g in groups:
        # refused before its tokens are built, as a single engine's replay does
        fits = [r for r in g.requests if r.prompt_len + r.output_tokens <= max_len]

        def make(position: int, arrival_s: float, fits: list[TraceRequest] = fits) -> Request:
            req = fits[position]
            return Request(str(req.line), arrival_s, builder.tokens(req), req.output_tokens)

        out.append(FleetGroup([r.arrival_s for r in fits], make, g.closed))
    return out


def fleet_advice(
    workload: Workload,
    builder: PromptBuilder,
    profiles: Profiles,
    options: AdviseOptions,
    instances: int,
    router: str = "round-robin",
) -> FleetAdvice:
    """Baseline, offload and offload-on-an-unlimited-export fleets over the workload's sample.
    ExportError when the storage profile is no shared export."""
    piece = sample(workload, options.sample_requests)
    base, off = options.arm_settings()
    setup = FleetSetup(
        profiles.model,
        profiles.gpu,
        profiles.storage,
        lambda offload: off if offload else base,
        router,
        seed=options.seed,
    )
    max_len = base.max_model_len or profiles.model.max_position
    runs: list[FleetRun] = []
    rejected = 0
    for offload, unlimited in ((False, False), (True, False), (True, True)):
        fleet: Fleet = build_fleet(setup, instances, offload, unlimited)
        replay = run_fleet_groups(fleet, _groups(piece.groups, builder, max_len))
        if not replay.placed:
            raise ValueError("no request of the workload could be simulated on the fleet")
        runs.append(measure(fleet, replay.placed, profiles.storage))
        rejected = piece.num_requests - len(replay.placed)
    return FleetAdvice(
        instances, router, piece.num_requests, rejected, FleetPoint(instances, *runs)
    )


def fleet_dict(adv: FleetAdvice) -> dict[str, Any]:
    p = adv.point
    off = p.offload
    return {
        "instances": adv.instances,
        "router": adv.router,
        "requests": adv.requests,
        "rejected": adv.rejected,
        "baseline_throughput_tok_s": p.baseline.fleet.total_token_throughput_tok_s,
        "offload_throughput_tok_s": off.fleet.total_token_throughput_tok_s,
        "baseline_mean_ttft_ms": p.baseline.fleet.mean_ttft_ms,
        "offload_mean_ttft_ms": off.fleet.mean_ttft_ms,
        "offload_gain_pct": p.offload_gain_pct,
        "cross_instance_hit_share": off.cross_instance_hit_share,
        "loaded_chunks": off.loaded_chunks,
        "export_read_gb": off.read_gb,
        "node_busy_share": off.node_busy,
        "export_cost_pct": p.export_cost_pct,
        "bottleneck": bottleneck(p),
    }


def fleet_lines(adv: FleetAdvice) -> list[str]:
    p = adv.point
    b, o = p.baseline.fleet, p.offload.fleet
    nodes = ", ".join(f"{k} {v * 100:.0f}%" for k, v in p.offload.node_busy.items())
    return [
        f"Fleet: {adv.instances} instances behind a {adv.router} router sharing the export "
        f"(first {adv.requests} requests, {adv.rejected} refused)",
        f"  throughput {b.total_token_throughput_tok_s:,.0f} -> "
        f"{o.total_token_throughput_tok_s:,.0f} tok/s ({p.offload_gain_pct:+.1f}%), mean TTFT "
        f"{b.mean_ttft_ms:,.0f} -> {o.mean_ttft_ms:,.0f} ms",
        f"  cross-instance hits: {p.offload.cross_instance_hit_share * 100:.0f}% of "
        f"{p.offload.loaded_chunks:,} chunks loaded were stored by another instance",
        f"  export nodes busy: {nodes}",
        f"  {verdict_line(p)}",
    ]
