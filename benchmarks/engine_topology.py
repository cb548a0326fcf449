"""What vLLM's process topology costs the engine tier, in CPU-seconds to start and to serve.

vLLM runs a one-GPU engine as two processes: the API server and an EngineCore whose one-process
executor holds the worker. Its CPU platform swaps that executor for the multiprocess one, a third
process that imports torch and vLLM again, unless VLLM_ENABLE_V1_MULTIPROCESSING=0
(vllm/platforms/cpu.py, check_and_update_config). The engine tier sets it
(tests/engine/conftest.py, ENGINE_TOPOLOGY_ENV). This starts the tier's offload engine, as the
tier renders it from the role, from the cached engine venv with the tiny model. It alternates the
two topologies, --repeat times each. For each start it measures the CPU-seconds of the engine's
process group until /health answers, then for --prompts 900-word prompts, and prints the medians
as ratios against the three-process reference measured in the same run.

    python benchmarks/engine_topology.py [--repeat 2] [--prompts 12]

Needs the engine venv (tests/engine/install_engine.sh, run here; minutes the first time) and
about a minute per start on 2 cores. Keep the machine otherwise quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "engine"), str(ROOT / "tests")]

import conftest as engine_tier  # noqa: E402  (tests/engine/conftest.py: the tier's own launch)

REFERENCE = "three processes (vLLM's CPU default)"
TOPOLOGIES: dict[str, dict[str, str]] = {
    REFERENCE: {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    "two processes (one GPU's; the tier's)": dict(engine_tier.ENGINE_TOPOLOGY_ENV),
}
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")


def _group_cpu_s(pgid: int) -> float:
    """CPU-seconds of the live processes of process group ``pgid``, their reaped children too."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            total += sum(int(v) for v in fields[11:15]) * tick_s  # utime stime cutime cstime
    return total


def _complete(url: str, prompt: str) -> None:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 32}).encode()
    request = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        response.read()


def measure(venv: Path, model: Path, env: dict[str, str], prompts: int) -> tuple[float, float]:
    """(CPU-s until /health, CPU-s for the prompts) of one offload engine with ``env``."""
    root = Path(tempfile.mkdtemp(prefix="kvops-topology-"))
    launch = engine_tier.plan_launch("topology", venv, model, "offload", root, extra_env=env)
    engine = engine_tier.start(launch)
    try:
        engine_tier.wait_ready(engine)
        started_cpu_s = _group_cpu_s(engine.proc.pid)
        rng = random.Random(0)
        for _ in range(prompts):
            _complete(engine.url, " ".join(rng.choice(WORDS) for _ in range(900)))
        return started_cpu_s, _group_cpu_s(engine.proc.pid) - started_cpu_s
    finally:
        engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="starts per topology (median)")
    parser.add_argument("--prompts", type=int, default=12, help="prompts per start")
    args = parser.parse_args()
    if not 1 <= args.repeat <= 20 or not 0 <= args.prompts <= 200:
        parser.error("--repeat must be 1 to 20 and --prompts 0 to 200")
    installed = subprocess.run(
        ["bash", str(ROOT / "tests" / "engine" / "install_engine.sh")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if installed.returncode != 0:
        print(f"the engine venv could not be installed:\n{installed.stderr[-2000:]}")
        return 2
    venv = Path(installed.stdout.strip().splitlines()[-1])
    model = engine_tier.build_tiny_model(venv)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in TOPOLOGIES}
    for round_ in range(args.repeat):
        for name, env in TOPOLOGIES.items():  # alternated: the machine's drift hits both alike
            start_s, serve_s = measure(venv, model, env, args.prompts)
            results[name].append((start_s, serve_s))
            print(f"round {round_ + 1}, {name}: start {start_s:.1f} CPU-s, "
                  f"{args.prompts} prompts {serve_s:.1f} CPU-s", flush=True)  # fmt: skip
    ref_start = statistics.median(s for s, _ in results[REFERENCE])
    ref_serve = statistics.median(s for _, s in results[REFERENCE])
    print(f"\n{'topology':<40} {'start CPU-s':>11} {'ratio':>6} {'serve CPU-s':>11} {'ratio':>6}")
    for name, runs in results.items():
        start_s = statistics.median(s for s, _ in runs)
        serve_s = statistics.median(s for _, s in runs)
        serve_ratio = f"{serve_s / ref_serve:6.2f}" if ref_serve > 0 else f"{'-':>6}"
        start_ratio = start_s / ref_start
        print(f"{name:<40} {start_s:11.1f} {start_ratio:6.2f} {serve_s:11.1f} {serve_ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
