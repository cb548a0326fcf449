"""A fleet of engines sharing one storage export: cross-instance hits, shared node bandwidth,
routers, and one instance behaving exactly as one engine does."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from kvops.cli.sim import sim
from kvops.sim.export import BIN_S, ExportError, NodeBudget, SharedExport
from kvops.sim.fleet import (
    FleetSetup,
    build_fleet,
    probe_export_limit,
    run_arm,
    run_fleet_batches,
    run_points,
)
from kvops.sim.fleet_report import fleet_lines, limit_range
from kvops.sim.lmcache_config import LMCacheSettings, gds_offload_keys
from kvops.sim.model import EngineSettings, build_engine
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.sim.router import PrefixAware, PrefixPolicy, RoundRobin
from kvops.sim.seed_workloads import SeedShape, run_batches, seed_batches

pytestmark = pytest.mark.unit

# Small prompts, and a GPU pool a hundredth of an H100's, so 12 prefixes of 1,024 tokens overflow
# it the way 20 x 28K-token prefixes overflow the real one.
SHAPE = SeedShape(prefix_tokens=1024, suffix_tokens=128, num_prefixes=12, batch_size=8,
                  iterations=3, output_tokens=4)  # fmt: skip


def _settings(offload: bool) -> EngineSettings:
    lm = LMCacheSettings(**gds_offload_keys(0, 0.0), gds_path="(virtual)")  # type: ignore[arg-type]
    return EngineSettings(offload=offload, lmcache=lm, num_gpu_blocks_override=400)


def _setup(router: str = "round-robin", storage: str = "ontap-nfs-rdma-200g", **kw: object):
    st = load_storage(storage)
    if kw:
        st = dataclasses.replace(st, **kw)  # type: ignore[arg-type]
    return FleetSetup(load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), st, _settings, router)


@pytest.mark.parametrize(
    ("model", "gpu", "tp"),
    [("llama-3.1-8b", "h100-sxm-80gb", 1), ("llama-3.1-70b", "h200-141gb", 2)],
)
def test_one_instance_on_the_export_is_exactly_one_engine(model: str, gpu: str, tp: int) -> None:
    """With node bandwidth above the host link, the fleet path of one instance gives the very
    records and counters of the single engine: the export adds nothing it does not model. (The
    70B's KV bytes per token are no power of two; two ranks write two files per chunk.)"""

    def settings(offload: bool) -> EngineSettings:
        return dataclasses.replace(_settings(offload), tensor_parallel_size=tp)

    setup = dataclasses.replace(
        _setup(), model=load_model(model), gpu=load_gpu(gpu), settings=settings
    )
    single = build_engine(setup.model, setup.gpu, setup.storage, settings(True))
    expected = run_batches(single, seed_batches("multi-prefix", SHAPE))
    fleet = build_fleet(setup, 1, offload=True)
    got = [rec for _, rec in run_fleet_batches(fleet, seed_batches("multi-prefix", SHAPE))]
    assert got == expected
    assert sum(r.offload_hit_tokens for r in got) > 0  # the case exercises loads and stores
    engine = fleet.engines[0]
    assert engine.stats == single.stats
    assert engine.offload is not None and single.offload is not None
    assert engine.offload.stats == single.offload.stats


def test_round_robin_loads_what_another_instance_stored() -> None:
    run = run_arm(_setup("round-robin"), "multi-prefix", SHAPE, 2, offload=True)
    assert run.loaded_chunks > 0
    assert 0 < run.cross_instance_chunks <= run.loaded_chunks
    assert all(p.requests == SHAPE.batch_size * 2 for p in run.per_instance)


def test_prefix_router_keeps_prefixes_home_and_spills_when_unbalanced() -> None:
    """One hot prefix, requests sent one after another: the prefix-aware router keeps it on one
    instance until the balance guard moves some elsewhere, and those load it from the export,
    where the first instance stored it."""
    shape = dataclasses.replace(SHAPE, batch_size=6, send_interval_s=0.05)
    home = run_arm(_setup("prefix"), "one-prefix", shape, 2, offload=True)
    assert home.cross_instance_chunks == 0
    spill = dataclasses.replace(_setup("prefix"), policy=PrefixPolicy(balance_abs_threshold=0))
    spread = run_arm(spill, "one-prefix", shape, 2, offload=True)
    assert spread.cross_instance_chunks > 0
    assert min(p.requests for p in spread.per_instance) > 0


def test_a_slow_export_slows_loads_as_instances_are_added() -> None:
    """Nodes slower than one host's link: each added instance queues on them."""
    setup = _setup(node_read_bandwidth_gb_s=2.0, node_write_bandwidth_gb_s=2.0)
    one = run_arm(setup, "multi-prefix", SHAPE, 1, offload=True)
    four = run_arm(setup, "multi-prefix", SHAPE, 4, offload=True)
    wait_one = sum(p.export_wait_s for p in one.per_instance) / one.loaded_chunks
    wait_four = sum(p.export_wait_s for p in four.per_instance) / four.loaded_chunks
    assert wait_four > wait_one
    free = run_arm(setup, "multi-prefix", SHAPE, 4, offload=True, unlimited=True)
    assert sum(p.export_wait_s for p in free.per_instance) == 0
    assert free.fleet.total_token_throughput_tok_s > four.fleet.total_token_throughput_tok_s


def test_node_budget_shares_capacity_and_leaves_unhindered_transfers_alone() -> None:
    node = NodeBudget("node0", 10.0)  # 10 GB/s
    finish, held = node.book(0.0, 1e9, 5e9)  # 1 GB at a 5 GB/s link: 0.2 s
    assert (finish, held) == (pytest.approx(0.2), False)
    # a second 1 GB at a 10 GB/s link in the same window gets only what is left (5 GB/s)
    finish2, held2 = node.book(0.0, 1e9, 10e9)
    assert held2 and finish2 == pytest.approx(0.2, abs=2 * BIN_S)
    assert node.busy_share(0.2) == pytest.approx(1.0)


def test_export_refuses_a_store_that_is_not_shared() -> None:
    with pytest.raises(ExportError, match="export_nodes"):
        SharedExport(load_storage("local-nvme"), 2)


def test_routers() -> None:
    rr = RoundRobin(3)
    assert [rr.choose([1], [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    router = PrefixAware(2, PrefixPolicy(balance_abs_threshold=2), seed=0)
    first = router.choose([10, 11, 12], [0, 0])
    in_flight = [0, 0]
    in_flight[first] += 1
    assert router.choose([10, 11, 99], in_flight) == first  # 2 of 3 chunks shared
    assert router.choose([50, 51], in_flight) != first  # new prefix: the instance sent less
    busy = [0, 0]
    busy[first] = 5
    assert router.choose([10, 11, 12], busy) != first  # balance guard


def test_cli_fleet_run_reports_reuse_the_export_and_the_bottleneck() -> None:
    args = ["run", "--scenario", "multi-shared-prefix", "--scale", "0.05", "--batch-size", "8",
            "--iterations", "3", "--output-tokens", "8", "--instances", "1,2"]  # fmt: skip
    result = CliRunner().invoke(sim, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [p["instances"] for p in doc["points"]] == [1, 2]
    two = doc["points"][1]
    assert two["offload"]["cross_instance_hit_share"] > 0
    assert len(two["offload"]["per_instance"]) == 2
    assert set(two["offload"]["node_busy_share"]) == {
        "node0_read", "node1_read", "node0_write", "node1_write"
    }  # fmt: skip
    assert two["bottleneck"] in ("gpu", "export")
    assert doc["export_bounds"]["all_at_once"] > 0
    limit = doc["export_limited_from_instances"]
    assert limit is None or limit > doc["export_not_limited_at_instances"]
    text = CliRunner().invoke(sim, args)
    assert text.exit_code == 0, text.output
    assert "bottleneck at 2 instances" in text.output and "closed form" in text.output
    # one instance is the single engine's command, unchanged
    alone = CliRunner().invoke(sim, ["run", "--scale", "0.05", "--iterations", "2"])
    same = CliRunner().invoke(sim, ["run", "--scale", "0.05", "--iterations", "2",
                                    "--instances", "1", "--router", "prefix"])  # fmt: skip
    assert alone.exit_code == 0 and alone.output == same.output
    local = CliRunner().invoke(sim, [*args, "--storage", "local-nvme"])
    assert local.exit_code == 2 and "export_nodes" in local.output
    for bad in (["--instances", "0"], ["--instances", "2,x"], ["--cpu-tier-gb", "1"]):
        refused = CliRunner().invoke(sim, [*args, *bad])
        assert refused.exit_code == 2, refused.output


def test_the_limit_search_doubles_the_fleet_until_the_export_limits_it() -> None:
    """Each node as fast as one host's link: one instance is never held back, a few are."""
    setup = _setup(node_read_bandwidth_gb_s=21.25, node_write_bandwidth_gb_s=18.75)
    points = run_points(setup, "multi-prefix", SHAPE, [1])
    assert not points[0].export_limited
    probes = probe_export_limit(setup, "multi-prefix", SHAPE, points)
    assert probes and probes[-1].export_limited
    assert all(not q.export_limited for q in probes[:-1])
    assert [q.instances for q in probes] == [2 * 2**k for k in range(len(probes))]
    fine, limited = limit_range(points, probes)
    assert limited == probes[-1].instances and fine is not None and fine < limited
    text = "\n".join(fleet_lines(points, setup.storage, "t", probes))
    assert f"starts to limit throughput between {fine} and {limited} instances" in text
    # a point already limited needs no search
    slow = _setup(node_read_bandwidth_gb_s=1.0, node_write_bandwidth_gb_s=1.0)
    limited_points = run_points(slow, "multi-prefix", SHAPE, [2])
    assert limited_points[0].export_limited
    assert probe_export_limit(slow, "multi-prefix", SHAPE, limited_points) == []
