"""Fleet simulation speed: the offload arm of scenario (3) over N instances sharing one export,
against N separate single engines given the same per-instance load, measured in the same run.

The ratio is what the fleet adds on top of its engines: routing (hashing each prompt), stepping
the instances in virtual-time order, and booking the export's nodes. Judged on CPU time (a busy
shared machine's wall clock also counts waiting for a core). Reports; never asserts.

    .venv/bin/python benchmarks/sim_fleet.py [--instances 8]
"""

from __future__ import annotations

import argparse
import time

from kvops.sim.fleet import FleetSetup, run_arm
from kvops.sim.lmcache_config import LMCacheSettings, gds_offload_keys
from kvops.sim.model import EngineSettings, build_engine, shared_kv_memory_bytes
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.sim.seed_workloads import SeedShape, run_batches, seed_batches

MODEL, GPU, STORAGE = "llama-3.1-8b", "h100-sxm-80gb", "ontap-nfs-rdma-200g"


def _settings(offload: bool) -> EngineSettings:
    lm = LMCacheSettings(**gds_offload_keys(8192, 0.0), gds_path="(virtual)")  # type: ignore[arg-type]
    kv = shared_kv_memory_bytes(MODEL, GPU, 8192)
    return EngineSettings(offload=offload, lmcache=lm, kv_cache_memory_bytes=kv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=8)
    n = parser.parse_args().instances
    shape = SeedShape()
    c0 = time.process_time()
    for seed in range(n):  # the same load as N engines on their own, each with its own store
        engine = build_engine(MODEL, GPU, STORAGE, _settings(True))
        shape_i = SeedShape(seed=seed)
        run_batches(engine, seed_batches("multi-prefix", shape_i))
    separate_s = time.process_time() - c0
    setup = FleetSetup(load_model(MODEL), load_gpu(GPU), load_storage(STORAGE), _settings)
    c0 = time.process_time()
    run = run_arm(setup, "multi-prefix", shape, n, offload=True)
    fleet_s = time.process_time() - c0
    print(
        f"fleet of {n}, one export:      {fleet_s:.2f} CPU s "
        f"({run.fleet.total_token_throughput_tok_s:,.0f} tok/s modelled)"
    )
    print(f"reference, {n} single engines: {separate_s:.2f} CPU s")
    print(f"fleet / separate engines:   {fleet_s / separate_s:.2f}x CPU")


if __name__ == "__main__":
    main()
