"""Fleet predictions as a JSON document and as terminal lines (`kvops sim run --instances`).

Why a separate module: `fleet.py` computes, this says it; the CLI stays thin. The lines are
meant to be read top to bottom: the fleet table (does offload pay at each size, how much of
what was loaded another instance stored, how busy the export was, what its bandwidth cost),
then the largest fleet per instance and per node, then one line naming the bottleneck and one
placing the point where the export starts to limit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvops.sim.fleet import (
    EXPORT_LIMIT_PCT,
    ExportBounds,
    FleetPoint,
    FleetRun,
    LimitProbe,
    export_bounds,
)
from kvops.sim.profiles import StorageProfile


def _run_dict(run: FleetRun) -> dict[str, Any]:
    return {
        **dataclasses.asdict(run.fleet),
        "duration_whole_run_s": run.duration_s,
        "read_gb": run.read_gb,
        "loaded_chunks": run.loaded_chunks,
        "cross_instance_chunks": run.cross_instance_chunks,
        "cross_instance_hit_share": run.cross_instance_hit_share,
        "node_busy_share": run.node_busy,
        "per_instance": [
            {
                **{k: v for k, v in dataclasses.asdict(p).items() if k != "summary"},
                **dataclasses.asdict(p.summary),
                "cross_instance_hit_share": p.cross_instance_hit_share,
            }
            for p in run.per_instance
        ],
    }


def bottleneck(point: FleetPoint) -> str:
    """`export` when the export's bandwidth costs more than EXPORT_LIMIT_PCT of throughput,
    else `gpu` (the GPUs, with each host's own link)."""
    return "export" if point.export_limited else "gpu"


def limit_range(
    points: list[FleetPoint], probes: list[LimitProbe]
) -> tuple[int | None, int | None]:
    """(largest fleet size simulated that the export does not limit, smallest that it does)."""
    sizes = [(p.instances, p.export_limited) for p in points]
    sizes += [(q.instances, q.export_limited) for q in probes]
    first = next((n for n, limited in sizes if limited), None)
    below = [n for n, limited in sizes if not limited and (first is None or n < first)]
    return (below[-1] if below else None), first


def fleet_doc(
    points: list[FleetPoint],
    storage: StorageProfile,
    header: dict[str, Any],
    probes: list[LimitProbe] | None = None,
) -> dict[str, Any]:
    bounds = export_bounds(storage, points[-1].unlimited) if points else None
    probes = probes or []
    fine, limited = limit_range(points, probes)
    return {
        **header,
        "export": {
            "nodes": storage.export_nodes,
            "node_read_bandwidth_gb_s": storage.node_read_bandwidth_gb_s,
            "node_write_bandwidth_gb_s": storage.node_write_bandwidth_gb_s,
            "host_link_read_bandwidth_gb_s": storage.read_bandwidth_gb_s,
            "host_link_write_bandwidth_gb_s": storage.write_bandwidth_gb_s,
        },
        "export_limit_pct": EXPORT_LIMIT_PCT,
        "points": [
            {
                "instances": p.instances,
                "offload_gain_pct": p.offload_gain_pct,
                "export_cost_pct": p.export_cost_pct,
                "bottleneck": bottleneck(p),
                "baseline": _run_dict(p.baseline),
                "offload": _run_dict(p.offload),
                "offload_unlimited_export": dataclasses.asdict(p.unlimited.fleet),
            }
            for p in points
        ],
        "export_limit_probes": [dataclasses.asdict(q) for q in probes],
        "export_not_limited_at_instances": fine,
        "export_limited_from_instances": limited,
        "export_bounds": dataclasses.asdict(bounds) if bounds else None,
    }


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def fleet_lines(
    points: list[FleetPoint],
    storage: StorageProfile,
    title: str,
    probes: list[LimitProbe] | None = None,
) -> list[str]:
    lines = [title]
    lines.append(
        f"{'instances':>9} {'baseline tok/s':>15} {'offload tok/s':>14} {'gain':>7} "
        f"{'cross-inst':>10} {'export read':>12} {'node busy':>9} {'export cost':>11}  bottleneck"
    )
    for p in points:
        off = p.offload
        read_gb_s = off.read_gb / off.duration_s if off.duration_s > 0 else 0.0
        busiest = max(off.node_busy.values(), default=0.0)
        lines.append(
            f"{p.instances:>9} {p.baseline.fleet.total_token_throughput_tok_s:>15,.0f} "
            f"{off.fleet.total_token_throughput_tok_s:>14,.0f} {p.offload_gain_pct:>+6.0f}% "
            f"{_pct(off.cross_instance_hit_share):>10} {read_gb_s:>7.1f} GB/s "
            f"{_pct(busiest):>9} {p.export_cost_pct:>10.1f}%  {bottleneck(p)}"
        )
    last = points[-1]
    lines.append("")
    lines.append(f"offload arm, {last.instances} instances:")
    lines.append(
        f"{'instance':>9} {'requests':>8} {'tok/s':>10} {'TTFT ms':>9} {'offload hit tok':>15} "
        f"{'read GB':>8} {'cross-inst':>10} {'link read':>9} {'export wait s':>13}"
    )
    for q in last.offload.per_instance:
        s = q.summary
        lines.append(
            f"{q.instance:>9} {q.requests:>8} {s.total_token_throughput_tok_s:>10,.0f} "
            f"{s.mean_ttft_ms:>9,.0f} {s.offload_hit_tokens:>15,} {q.read_gb:>8.1f} "
            f"{_pct(q.cross_instance_hit_share):>10} {_pct(q.link_read_busy):>9} "
            f"{q.export_wait_s:>13.2f}"
        )
    nodes = ", ".join(f"{name} {_pct(v)}" for name, v in last.offload.node_busy.items())
    lines.append(f"export nodes busy over the run: {nodes}")
    lines.append("")
    lines.append(verdict_line(last))
    bounds = export_bounds(storage, last.unlimited)
    lines.extend(_limit_lines(points, probes or [], bounds))
    return lines


def verdict_line(p: FleetPoint) -> str:
    free = p.unlimited.fleet.total_token_throughput_tok_s
    if p.export_limited:
        return (
            f"bottleneck at {p.instances} instances: the export's bandwidth: throughput "
            f"{p.export_cost_pct:.1f}% below the same fleet on an export without limits "
            f"({free:,.0f} tok/s)"
        )
    return (
        f"bottleneck at {p.instances} instances: the GPUs (with each host's own link), not the "
        f"export: its bandwidth costs {p.export_cost_pct:.1f}% of throughput "
        f"(limit: {EXPORT_LIMIT_PCT:g}%)"
    )


def _limit_lines(
    points: list[FleetPoint], probes: list[LimitProbe], bounds: ExportBounds | None
) -> list[str]:
    lines = []
    fine, limited = limit_range(points, probes)
    tried = ", ".join(f"{q.export_cost_pct:.1f}% at {q.instances}" for q in probes)
    how = f" (offload arm alone at larger fleets; export cost {tried})" if probes else ""
    if limited is not None:
        since = f"between {fine} and {limited}" if fine is not None else f"at {limited} or fewer"
        lines.append(f"the export's bandwidth starts to limit throughput {since} instances{how}")
    else:
        top = max([p.instances for p in points] + [q.instances for q in probes])
        lines.append(f"the export does not limit throughput up to {top} instances{how}")
    if bounds is not None:
        lines.append(
            f"closed form: the export ({bounds.read_capacity_gb_s:g} GB/s read, "
            f"{bounds.write_capacity_gb_s:g} GB/s write) keeps up with {bounds.all_at_once:.1f} "
            f"instances all reading at link speed at once, and with {bounds.on_average:.1f} at "
            f"this workload's mean demand ({bounds.mean_read_gb_s_per_instance:.2f} GB/s read, "
            f"{bounds.mean_write_gb_s_per_instance:.2f} GB/s write per instance asked by "
            f"{points[-1].instances}); the simulated limit lies between the two"
        )
    return lines
