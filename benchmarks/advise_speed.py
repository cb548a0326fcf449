"""`kvops advise` speed: a 100,000-request trace analysed (both arms, ranges, flip points), as a
ratio to one replay of the same trace through the simulator's model alone, both measured in
this run. Target: reading the trace plus the analysis in under 30 s of CPU on one core. The
analysis replays a sample of windows of a trace this long (`kvops.advise.windows`); the
output quotes what it sampled.

The trace is Mooncake-shaped (hash_ids of 512-token blocks; github.com/kvcache-ai/Mooncake
FAST25-release/traces) and seeded: Poisson arrivals, each prompt one of `--prefixes` shared
prefixes of `--prefix-blocks` blocks plus one or two unique blocks, output lengths uniform in
[`--min-output`, `--max-output`]. The reference replay feeds the same requests to one engine
(offload arm, as `kvops sim run` configures it) through the model's own incremental API
(`add_request` as virtual time reaches each arrival, then `step`), with no summarising.
Judged on process CPU time, since the wall clock of a busy shared machine also counts waiting
for a core. Reports; never asserts.

    .venv/bin/python benchmarks/advise_speed.py [--requests 100000] [--rate 5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from kvops.advise.analysis import AdviseOptions, analyse
from kvops.advise.arms import Profiles
from kvops.advise.recommend import advise
from kvops.advise.render import sampling_notes
from kvops.advise.trace import ReadOptions, load_workload
from kvops.advise.workload import PromptBuilder, Workload
from kvops.sim.model import build_engine
from kvops.sim.profiles import load_gpu, load_model, load_storage
from kvops.sim.records import Request

TARGET_REQUESTS = 100_000
TARGET_CPU_S = 30.0


def write_trace(path: Path, args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    n = args.requests
    arrivals_ms = np.cumsum(rng.exponential(1e3 / args.rate, n)).astype(np.int64)
    prefixes = rng.integers(0, args.prefixes, n)
    tails = rng.integers(1, 3, n)
    trims = rng.integers(0, 500, n)
    outputs = rng.integers(args.min_output, args.max_output + 1, n)
    next_id = args.prefixes * args.prefix_blocks
    with path.open("w") as fh:
        for i in range(n):
            base = int(prefixes[i]) * args.prefix_blocks
            ids = list(range(base, base + args.prefix_blocks))
            ids += list(range(next_id, next_id + int(tails[i])))
            next_id += int(tails[i])
            line = {
                "timestamp": int(arrivals_ms[i]),
                "input_length": len(ids) * 512 - int(trims[i]),
                "output_length": int(outputs[i]),
                "hash_ids": ids,
            }
            fh.write(json.dumps(line) + "\n")


def reference_replay(workload: Workload, builder: PromptBuilder, profiles: Profiles) -> int:
    """One replay through the model's own API; returns the number of engine steps."""
    _, offload = AdviseOptions().arm_settings()
    engine = build_engine(profiles.model, profiles.gpu, profiles.storage, offload)
    reqs = list(workload.requests())
    i = 0
    while i < len(reqs) or engine.has_work():
        limit = engine.next_step_start_s() if engine.has_work() else reqs[i].arrival_s
        while i < len(reqs) and reqs[i].arrival_s <= limit:
            r = reqs[i]
            engine.add_request(Request(str(i), r.arrival_s, builder.tokens(r), r.output_tokens))
            i += 1
        engine.step()
    return engine.stats.num_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=TARGET_REQUESTS)
    parser.add_argument("--rate", type=float, default=5.0, help="requests per second")
    parser.add_argument("--prefixes", type=int, default=200)
    parser.add_argument("--prefix-blocks", type=int, default=8)
    parser.add_argument("--min-output", type=int, default=50)
    parser.add_argument("--max-output", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    profiles = Profiles(
        load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(path, args)
        c0 = time.process_time()
        workload = load_workload(str(path), ReadOptions(), profiles.model.vocab_size, "x")
        read_cpu_s = time.process_time() - c0
    builder = PromptBuilder(profiles.model.vocab_size, 512)

    c0, t0 = time.process_time(), time.perf_counter()
    steps = reference_replay(workload, builder, profiles)
    replay_cpu_s, replay_wall_s = time.process_time() - c0, time.perf_counter() - t0

    c0, t0 = time.process_time(), time.perf_counter()
    analysis = analyse(workload, profiles, AdviseOptions(), builder)
    verdict = advise(analysis).verdict
    analyse_cpu_s, analyse_wall_s = time.process_time() - c0, time.perf_counter() - t0
    total_cpu_s = read_cpu_s + analyse_cpu_s

    target = TARGET_CPU_S * args.requests / TARGET_REQUESTS
    met = "met" if total_cpu_s < target else "NOT met"
    print(f"requests:                        {args.requests:,} ({steps:,} engine steps per replay)")
    print(f"reading the trace:               {read_cpu_s:.2f} CPU s")
    print(f"reference, one model replay:     {replay_cpu_s:.2f} CPU s "
          f"({replay_wall_s:.2f} wall s)")  # fmt: skip
    print(f"kvops advise analysis:           {analyse_cpu_s:.2f} CPU s "
          f"({analyse_wall_s:.2f} wall s)")  # fmt: skip
    print(f"analysis / one replay:           {analyse_cpu_s / replay_cpu_s:.2f}x")
    whole = args.requests if analysis.sample_requests is None else analysis.sample_requests
    replayed = "; ".join(sampling_notes(analysis)) or (
        f"both arms whole, ranges and flip search on {whole:,} requests"
    )
    print(f"what was replayed:               {replayed}")
    print(f"verdict:                         offload {verdict}")
    print(f"target: read + analysis < {target:.1f} CPU s for {args.requests:,} requests: "
          f"{met} ({total_cpu_s:.2f} CPU s)")  # fmt: skip


if __name__ == "__main__":
    main()
