"""Two deployed offload hosts sharing one GDS directory: a prefix stored by one is a hit on the
other (issue 28, "a fleet sharing one KV store on ONTAP", in the lab tier).

The shared ONTAP export is one directory on this machine, bind-mounted into both lab hosts at
the GDS directory (`LabHosts.bind_mount`; the lab kernel has no NFS, and the mount.nfs double
gives each host a private tmpfs). The hosts are the deploy lab's (tests/lab/conftest.py), after
test_deploy.py and test_deploy_collection.py are done with it: the A/B lab's baseline host
becomes a second offload host. Everything else is what production runs: site.yml and
deploy.yml converge both hosts as offload hosts with the same model string, chunk size, hash
algorithm and service uid/gid (tests/lab/deploy_lab_vars.yml); the engine is the role's
`kvops sim serve` running as the service user, which reads the directory as LMCache's GDS
backend does: on a miss it looks for the chunk's files on disk, so files another process stored
are found (kvops/sim/gds_files.py; LMCache `gds_backend.py`,
https://github.com/LMCache/LMCache/blob/dev/lmcache/v1/storage_backend/gds_backend.py).

What proves the hit on host B is B's own counters (`vllm:external_prefix_cache_hits`,
`lmcache:num_hit_tokens`) and the response's `usage.prompt_tokens_details.cached_tokens`; the
time to first token agrees (B's hit against a cold miss of the same length on B, measured in the
same test, with a wide margin). `kvops ab-test --arm offload=A,B --route prefix-handoff` then
measures the cross-instance hit share from the instances' counters, and `kvops ab-test --deploy
--limit A,B`, run as an operator without a checkout runs it (the installed kvops.gds collection,
from a folder outside the checkout), switches both hosts of each arm together.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deploy_lab import (
    BASELINE,
    DEPLOY_VARS,
    GDS_DIR,
    OFFLOAD,
    SERVICE_UID,
    run_deploy,
)
from installed_collection import (
    INSTALLED_PATH,
    OPERATOR_CONFIG_WITH_JUNIT,
    REPO,
    Installed,
    install_collection,
)
from lab_harness import LabHosts
from sim_server import sim_server
from site_lab import SITE_VARS, explain

from kvops.abtest.engine_counters import counter_delta, read_counters

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

HOST_A, HOST_B = OFFLOAD, BASELINE  # the deploy lab's hosts; HOST_A prunes the store (PRUNE)
# The engine's profile on both hosts (and on the local baseline of the ab-test), in real time
# (--time-scale 1): an 8k-token prefill on the modelled L40S takes about a second, loading it
# from the store about a tenth of that, so the two are far apart against the lab's own noise.
ENGINE_ARGS = [
    "--gpu", "l40s-48gb", "--storage", "ontap-nfs-rdma-200g", "--time-scale", "1",
]  # fmt: skip
MODEL = "llama-3.1-8b"
CHUNK_TOKENS = 256  # LMCache chunk_size of the role's config
PROMPT_TOKENS = 8192  # 32 chunks
FLEET_WORKLOAD = Path(__file__).parents[1] / "fixtures" / "workloads" / "fleet-small.yaml"


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in for the ONTAP export's GDS directory: owned by the service uid/gid that
    both hosts share, with the mode nfs_rdma_mount gives it (0750)."""
    path = tmp_path_factory.mktemp("ontap-export") / "gds"
    path.mkdir(mode=0o750)
    os.chown(path, SERVICE_UID, SERVICE_UID)
    return path


@pytest.fixture(scope="module")
def fleet(
    deploy_lab: LabHosts,
    deployed: subprocess.CompletedProcess[str],
    export_dir: Path,
    wheel_vars: dict[str, Any],
) -> Iterator[LabHosts]:
    """The deploy lab (site.yml and deploy.yml done; conftest.py's `deployed`), last of the
    modules that use it: the shared directory mounted at both hosts' GDS directory, then both
    deployed as offload hosts (deploy.yml, the lab's A/B host becoming a second offload host):
    each engine starts again, on the shared store."""
    lab = deploy_lab
    for name in lab.names:
        lab.bind_mount(name, export_dir, GDS_DIR)
    offload = {"vllm_lmcache_variant": "offload", "vllm_lmcache_extra_args": ENGINE_ARGS}
    proc = run_deploy(lab, wheel_vars, extra_vars=offload)
    assert proc.returncode == 0, explain(proc)
    yield lab


def _url(lab: LabHosts, host: str) -> str:
    return f"http://{lab.host(host).ip}:8000"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return str(resp.read().decode())


def _counters(url: str) -> dict[str, float]:
    return dict(read_counters(_get(url + "/metrics")))


def _stream(url: str, prompt: list[int]) -> tuple[float, dict[str, Any]]:
    """One streamed completion: (seconds to the first token, the final usage)."""
    model = json.loads(_get(url + "/v1/models"))["data"][0]["id"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    first: float | None = None
    usage: dict[str, Any] = {}
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[len(b"data: ") :])
            if event.get("choices") and first is None:
                first = time.perf_counter() - start
            usage = event.get("usage") or usage
    assert first is not None, "no token streamed"
    return first, usage


def _chunks(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.kvcache.safetensors.metadata"))


def _wait_for_chunks(directory: Path, at_least: int, timeout_s: float = 60) -> list[Path]:
    """The engine writes a chunk's files after the step that computed it: wait for them."""
    deadline = time.monotonic() + timeout_s
    while len(found := _chunks(directory)) < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_a_prefix_stored_by_host_a_is_a_hit_on_host_b(fleet: LabHosts, export_dir: Path) -> None:
    a, b = _url(fleet, HOST_A), _url(fleet, HOST_B)
    prefix = [3000 + i for i in range(PROMPT_TOKENS)]
    other = [90000 + i for i in range(PROMPT_TOKENS)]  # the same length, never sent before
    full_chunks = PROMPT_TOKENS // CHUNK_TOKENS - 1  # the last, partial one is not stored

    before_a = _chunks(export_dir)
    _stream(a, prefix)
    stored = set(_wait_for_chunks(export_dir, len(before_a) + full_chunks)) - set(before_a)
    assert len(stored) >= full_chunks, f"host A stored {len(stored)} chunks in the export"
    # written by A's engine as the service user, and seen through B's own mount
    assert {p.stat().st_uid for p in stored} == {SERVICE_UID}
    seen_on_b = fleet.ssh(HOST_B, ["find", GDS_DIR, "-name", "*.metadata"], sudo=True).stdout
    assert {p.name for p in stored} <= {Path(line).name for line in seen_on_b.split()}

    # A cold miss of the same length on B, then the prefix A computed.
    cold_ttft_s, cold_usage = _stream(b, other)
    assert cold_usage["prompt_tokens_details"]["cached_tokens"] == 0, cold_usage
    before_b = _counters(b)
    hit_ttft_s, hit_usage = _stream(b, prefix)
    got = counter_delta(before_b, _counters(b))

    hit_tokens = full_chunks * CHUNK_TOKENS
    assert got["external_hit_tokens"] >= hit_tokens, got  # loaded from the shared store
    assert got["lmcache_hit_tokens"] >= hit_tokens, got
    assert got["gpu_hit_tokens"] == 0, got  # B never computed this prefix
    assert hit_usage["prompt_tokens_details"]["cached_tokens"] >= hit_tokens, hit_usage
    # Loading ~8k tokens of KV from the store is modelled at about a tenth of computing them;
    # half is the bar, so the lab's scheduling noise cannot make it pass or fail by itself.
    assert hit_ttft_s < 0.5 * cold_ttft_s, (hit_ttft_s, cold_ttft_s)


@pytest.fixture
def local_baseline(tmp_path: Path) -> Iterator[str]:
    """The ab-test's baseline arm: the same engine profile without offload, on this machine."""
    with sim_server(
        None, tmp_path / "baseline.log", MODEL, "--host", "127.0.0.1", *ENGINE_ARGS
    ) as url:
        yield url


def test_ab_test_prefix_handoff_measures_cross_instance_hits(
    fleet: LabHosts, local_baseline: str, tmp_path: Path
) -> None:
    """Each prefix's first request goes to one host and its reuse to the other: the reuse is a
    hit on the other host, counted by that host's own counters."""
    a, b = _url(fleet, HOST_A), _url(fleet, HOST_B)
    out = tmp_path / "ab-fleet"
    kvops = str(Path(sys.executable).parent / "kvops")
    proc = subprocess.run(
        [kvops, "ab-test", "--arm", f"baseline={local_baseline}", "--arm", f"offload={a},{b}",
         "--route", "prefix-handoff", "--workload", str(FLEET_WORKLOAD), "--trials", "2",
         "--warmup-iterations", "0", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=fleet.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["options"]["route"] == "prefix-handoff"
    arms = doc["scenarios"]["fleet"]["arms"]
    assert arms["baseline"]["errors_total"] == 0 and arms["offload"]["errors_total"] == 0
    offload = arms["offload"]
    instances = offload["instances"]
    assert [i["url"] for i in instances] == [a, b]
    # 2 trials x 2 iterations x 4 requests, spread over both hosts
    assert sum(i["requests"] for i in instances) == 16
    assert all(i["requests"] > 0 and i["errors"] == 0 for i in instances), instances
    assert offload["cross_instance_hit_share"] > 0.0, offload
    assert any(i["cross_instance_hit_tokens"] > 0 for i in instances), instances


@dataclass(frozen=True)
class FleetAbTest:
    installed: Installed
    out: Path  # the run directory
    junit: Path  # where the operator's junit callback wrote
    proc: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def fleet_ab_test_deploy(
    fleet: LabHosts, wheel_vars: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> FleetAbTest:
    """`kvops ab-test --deploy --limit A,B` run once, as an operator without a checkout runs it:
    from a folder outside the checkout, with the operator's own ansible.cfg naming only the
    collections path the built tarball was installed into (the checkout's own deploy.yml runs
    ab-test --deploy in tests/lab/test_deploy.py). Last in the module: it leaves the hosts on
    whichever variant was deployed last. Two tests read it."""
    installed = install_collection(
        tmp_path_factory.mktemp("fleet-operator"), OPERATOR_CONFIG_WITH_JUNIT
    )
    junit = installed.user_dir / "junit"
    out = installed.user_dir / "ab-deploy-fleet"
    argv = [str(Path(sys.executable).parent / "kvops"), "ab-test", "--deploy",
            "--limit", f"{HOST_A},{HOST_B}"]  # fmt: skip
    for source in (fleet.inventory_path, SITE_VARS, DEPLOY_VARS):
        argv += ["-i", str(source)]
    for key, value in {**wheel_vars, "vllm_lmcache_extra_args": ENGINE_ARGS}.items():
        argv += ["--deploy-var", f"{key}={json.dumps(value)}"]
    # One trial: what is under test is the deploy of both hosts together, not a verdict (one
    # trial deploys each variant once on both hosts; more only repeat those runs).
    argv += ["--workload", str(FLEET_WORKLOAD), "--trials", "1", "--warmup-iterations", "0",
             "--route", "prefix-handoff", "--out", str(out), "--json"]  # fmt: skip
    env = installed.env(fleet.env({"PYTHONPATH": str(REPO), "JUNIT_OUTPUT_DIR": str(junit)}))
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=1200, cwd=installed.user_dir
    )
    return FleetAbTest(installed, out, junit, proc)


def test_ab_test_deploy_runs_the_installed_collection_from_outside_the_checkout(
    fleet_ab_test_deploy: FleetAbTest,
) -> None:
    """kvops picks the installed ``kvops.gds.deploy`` (run.json keeps no project root), the
    roles that run are the installed copy's (the task paths in the JUnit file the operator's
    configuration asks for), and results.json is written and printed."""
    run, installed = fleet_ab_test_deploy, fleet_ab_test_deploy.installed
    assert REPO not in installed.user_dir.parents
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    # kvops chose the installed collection (no checkout around the working directory) ...
    recorded = json.loads((run.out / "run.json").read_text())
    assert recorded["deploy"]["project_root"] is None, recorded["deploy"]
    # ... and the roles that ran are the installed copy's, never the checkout's
    paths = {
        case.get("classname", "")
        for report in run.junit.glob("*.xml")
        for case in ET.parse(report).getroot().iter("testcase")
    }
    role = str(installed.collections / INSTALLED_PATH / "roles" / "vllm_lmcache")
    assert any(p.startswith(role) for p in paths), sorted(paths)[:20]
    assert not any(p.startswith(str(REPO)) for p in paths), sorted(paths)[:20]
    doc = json.loads((run.out / "results.json").read_text())
    assert json.loads(run.proc.stdout) == doc
    scenario = doc["scenarios"]["fleet"]
    assert scenario["verdict"] == "not enough trials", scenario["verdict"]  # one trial: no claim


def test_ab_test_deploy_switches_every_host_of_an_arm_together(
    fleet: LabHosts, fleet_ab_test_deploy: FleetAbTest
) -> None:
    """`--deploy --limit A,B`: each arm is the fleet of both hosts, and every deploy puts its
    variant on both at once (one deploy.yml run; the deploys' records name both hosts)."""
    out, proc = fleet_ab_test_deploy.out, fleet_ab_test_deploy.proc
    assert proc.returncode == 0, proc.stderr[-4000:]
    deploys = [json.loads(line) for line in (out / "deploys.jsonl").read_text().splitlines()]
    assert deploys and all(d["status"] == "successful" for d in deploys), deploys
    for record in deploys:  # both hosts, on the arm's variant, in one run
        assert sorted(record["deployed"]) == [HOST_A, HOST_B], record
        variants = {h["variant"] for h in record["deployed"].values()}
        assert variants == {record["variant"]}, record
    assert {d["variant"] for d in deploys} == {"baseline", "offload"}
    doc = json.loads((out / "results.json").read_text())
    arms = doc["scenarios"]["fleet"]["arms"]
    urls = [_url(fleet, HOST_A), _url(fleet, HOST_B)]
    for name in ("baseline", "offload"):
        assert arms[name]["errors_total"] == 0, arms[name]
        assert [i["url"] for i in arms[name]["instances"]] == urls, arms[name]["instances"]
    # every instance of an arm was read with that arm's deploy in place: no instance of the
    # offload arm looks like a baseline engine (another connector, other KV blocks)
    within_arm = [w for w in doc["warnings"] if w.startswith(("arm baseline:", "arm offload:"))]
    assert within_arm == [], within_arm
    recorded = json.loads((out / "arms.json").read_text())
    for arm in next(iter(recorded.values())):
        connectors = {i["cache_config"]["kv_connector"] for i in arm["instances"]}
        assert connectors == {"none" if arm["name"] == "baseline" else "LMCacheConnectorV1"}, arm
    # both offload hosts store into the one directory (the store is emptied before every
    # deploy, so reuse within a segment comes from the GPU caches; the hits across hosts are
    # the previous tests')
    assert all(i["stored_tokens"] > 0 for i in arms["offload"]["instances"]), arms["offload"]
