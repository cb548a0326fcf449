"""playbooks/deploy.yml (role vllm_lmcache) on lab hosts prepared by site.yml.

kvlab-1 runs the offload variant, kvlab-2 the baseline; the service manager double runs the real
unit file, so the engine (`kvops sim serve`, installed by the role's pip task) really starts as
the service user, reads the rendered LMCache YAML / environment file / connector JSON and writes
LMCache-layout chunk files into the GDS directory on the (double) NFS mount.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_lab import (
    BASELINE,
    DEPLOY_VARS,
    GDS_DIR,
    OFFLOAD,
    SERVICE,
    SERVICE_UID,
    run_deploy,
)
from lab_harness import LabHosts
from site_lab import SITE_VARS, explain, recap

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

PRUNE_UNITS = "/etc/systemd/system/kvops-gds-prune"


def _completion(lab: LabHosts, host: str, prompt_words: int = 1200) -> dict[str, Any]:
    """One request long enough to fill several 256-token chunks."""
    body = json.dumps(
        {"model": "llama-3.1-8b", "prompt": " ".join(["kvops"] * prompt_words), "max_tokens": 4}
    ).encode()
    request = urllib.request.Request(
        f"http://{lab.host(host).ip}:8000/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.load(response))


def _chunk_files(lab: LabHosts, host: str) -> list[str]:
    proc = lab.ssh(host, ["find", GDS_DIR, "-type", "f"], sudo=True)
    return [line for line in proc.stdout.splitlines() if line.strip()]


def test_deploy_converges_and_a_second_run_changes_nothing(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    again = run_deploy(deploy_lab, wheel_vars)
    assert again.returncode == 0, explain(again)
    for host, counts in recap(again).items():
        assert counts["changed"] == 0, f"{host} changed on the second run:\n{explain(again)}"
        assert counts["failed"] == 0


def test_check_mode_with_diff_reports_no_change_on_a_converged_host(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    proc = run_deploy(deploy_lab, wheel_vars, check=True, diff=True)
    assert proc.returncode == 0, explain(proc)
    assert all(c["changed"] == 0 for c in recap(proc).values()), explain(proc)


def test_the_unit_env_file_and_lmcache_yaml_are_what_the_engine_reads(
    deploy_lab: LabHosts, deployed: subprocess.CompletedProcess[str]
) -> None:
    host = deploy_lab.testinfra(OFFLOAD)
    unit = host.file(f"/etc/systemd/system/{SERVICE}.service").content_string
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[:4] == ["/opt/kvops/vllm-venv/bin/kvops", "sim", "serve", "llama-3.1-8b"]
    connector = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert connector["kv_connector"] == "LMCacheConnectorV1Dynamic"
    assert connector["kv_load_failure_policy"] == "recompute"
    assert "--shutdown-timeout" in argv
    assert "User=vllm" in unit.splitlines()
    env_file = host.file(f"/etc/kvops/{SERVICE}.env")
    assert env_file.mode == 0o640
    env = dict(line.split("=", 1) for line in env_file.content_string.splitlines() if "=" in line)
    assert env["LMCACHE_CONFIG_FILE"] == "/etc/kvops/lmcache.yaml"
    assert env["PYTHONHASHSEED"] == "0"
    assert env["LMCACHE_TRACK_USAGE"] == "false"
    lmcache = yaml.safe_load(host.file("/etc/kvops/lmcache.yaml").content_string)
    assert lmcache["gds_path"] == GDS_DIR
    assert lmcache["gds_buffer_size"] == 1024
    assert lmcache["pre_caching_hash_algorithm"] == "sha256_cbor"
    assert host.user("vllm").uid == SERVICE_UID
    assert host.file(GDS_DIR).uid == SERVICE_UID
    # The running engine is the service user's process.
    pid = host.file(f"/run/kvops-test-doubles/systemd/{SERVICE}.service.pid").content_string
    assert host.check_output(f"stat -c %u /proc/{pid.split()[0]}") == str(SERVICE_UID)
    baseline = deploy_lab.testinfra(BASELINE)
    assert not baseline.file("/etc/kvops/lmcache.yaml").exists
    assert "LMCACHE_CONFIG_FILE" not in baseline.file(f"/etc/kvops/{SERVICE}.env").content_string


def test_the_named_host_alone_prunes_the_store_with_kvops_gds_prune(
    deploy_lab: LabHosts, deployed: subprocess.CompletedProcess[str]
) -> None:
    """The timer is enabled and started on vllm_lmcache_prune_host only; its service runs the
    engine venv's `kvops gds prune` on the store as the service user (started by hand here: the
    service manager double never fires a timer) and keeps the chunks the engine just wrote:
    under the budget, and used within --min-age."""
    host = deploy_lab.testinfra(OFFLOAD)
    unit = host.file(f"{PRUNE_UNITS}.service").content_string
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv == [
        "/opt/kvops/vllm-venv/bin/kvops", "gds", "prune", GDS_DIR,
        "--min-age", "5m", "--tmp-age", "1h", "--max-bytes", "64G",
    ]  # fmt: skip
    assert "User=vllm" in unit.splitlines()
    assert host.file(f"{PRUNE_UNITS}.timer").exists
    systemctl = ["systemctl", "is-enabled", "kvops-gds-prune.timer"]
    assert deploy_lab.ssh(OFFLOAD, systemctl, sudo=True).stdout.strip() == "enabled"
    active = ["systemctl", "is-active", "kvops-gds-prune.timer"]
    assert deploy_lab.ssh(OFFLOAD, active, sudo=True).stdout.strip() == "active"
    _completion(deploy_lab, OFFLOAD)
    written = [f for f in _chunk_files(deploy_lab, OFFLOAD) if ".tmp" not in f]
    assert written, "the engine stored no chunk"
    start = ["systemctl", "start", "kvops-gds-prune.service"]
    run = deploy_lab.ssh(OFFLOAD, start, sudo=True, check=False)
    assert run.returncode == 0, run.stderr  # exit 0: the store is within its budget
    log = deploy_lab.read_file(
        OFFLOAD, "/var/log/kvops-test-doubles/units/kvops-gds-prune.service.log"
    )
    assert "chunks" in log and "removed 0 chunks" in log, log
    assert set(written) <= set(_chunk_files(deploy_lab, OFFLOAD))
    baseline = deploy_lab.testinfra(BASELINE)
    assert not baseline.file(f"{PRUNE_UNITS}.timer").exists
    assert not baseline.file(f"{PRUNE_UNITS}.service").exists


def test_secrets_stay_out_of_the_output_the_unit_file_and_the_command_line(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    """HF_TOKEN (given the old way, in vllm_lmcache_env) and VLLM_API_KEY (vllm_lmcache_secret_env):
    neither a --check --diff preview nor a real run prints them; they are in the secret
    environment file (root:vllm 0640) and the engine's environment, not in the unit file, the
    other environment file or the engine's command line."""
    token, api_key = "hf_kvopsLabS3cretT0ken", "sk-kvopsLabS3cretApiKey"
    secrets = {
        "vllm_lmcache_env": {"HF_TOKEN": token},
        "vllm_lmcache_secret_env": {"VLLM_API_KEY": api_key},
    }
    try:
        preview = run_deploy(
            deploy_lab, wheel_vars, check=True, diff=True, limit=OFFLOAD, extra_vars=secrets
        )
        assert preview.returncode == 0, explain(preview)
        assert recap(preview)[OFFLOAD]["changed"] > 0  # the secret file would change ...
        said = preview.stdout + preview.stderr
        assert token not in said and api_key not in said  # ... without showing it
        proc = run_deploy(deploy_lab, wheel_vars, diff=True, limit=OFFLOAD, extra_vars=secrets)
        assert proc.returncode == 0, explain(proc)
        said = proc.stdout + proc.stderr
        assert token not in said and api_key not in said
        host = deploy_lab.testinfra(OFFLOAD)
        secret_file = host.file(f"/etc/kvops/{SERVICE}.secret.env")
        assert (secret_file.user, secret_file.group, secret_file.mode) == ("root", "vllm", 0o640)
        assert f"HF_TOKEN={token}" in secret_file.content_string.splitlines()
        assert f"VLLM_API_KEY={api_key}" in secret_file.content_string.splitlines()
        unit = host.file(f"/etc/systemd/system/{SERVICE}.service").content_string
        env = host.file(f"/etc/kvops/{SERVICE}.env").content_string
        for text in (unit, env):
            assert token not in text and api_key not in text
        pid = host.file(f"/run/kvops-test-doubles/systemd/{SERVICE}.service.pid").content_string
        pid = pid.split()[0]
        cmdline = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
        assert "sim serve" in cmdline and api_key not in cmdline and token not in cmdline
        environ = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
        assert f"VLLM_API_KEY={api_key}" in environ  # where vLLM reads it (vllm/envs.py)
    finally:
        restored = run_deploy(deploy_lab, wheel_vars, limit=OFFLOAD)
        assert restored.returncode == 0, explain(restored)


def test_offload_writes_chunk_files_and_baseline_does_not(
    deploy_lab: LabHosts, deployed: subprocess.CompletedProcess[str]
) -> None:
    _completion(deploy_lab, OFFLOAD)
    _completion(deploy_lab, BASELINE)
    assert any(f.endswith(".kvcache.safetensors") for f in _chunk_files(deploy_lab, OFFLOAD))
    assert _chunk_files(deploy_lab, BASELINE) == []


def test_switching_variants_twice_with_clearing_leaves_no_stale_chunks(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    _completion(deploy_lab, OFFLOAD, prompt_words=900)
    assert _chunk_files(deploy_lab, OFFLOAD), "the offload host wrote no chunk files"
    for variant in ("baseline", "offload"):
        proc = run_deploy(
            deploy_lab,
            wheel_vars,
            limit=OFFLOAD,
            extra_vars={"vllm_lmcache_variant": variant, "vllm_lmcache_clear_gds_dir": True},
        )
        assert proc.returncode == 0, explain(proc)
        assert _chunk_files(deploy_lab, OFFLOAD) == [], f"stale chunks after switching to {variant}"
    assert deploy_lab.testinfra(OFFLOAD).file(GDS_DIR).uid == SERVICE_UID


def test_an_unknown_lmcache_key_fails_before_anything_changes(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    before = deploy_lab.read_file(OFFLOAD, "/etc/kvops/lmcache.yaml")
    proc = run_deploy(
        deploy_lab,
        wheel_vars,
        limit=OFFLOAD,
        extra_vars={"vllm_lmcache_config": {"chunk_sise": 512}},
    )
    assert proc.returncode != 0
    assert '"chunk_sise" (did you mean "chunk_size"?)' in proc.stdout, explain(proc)
    assert deploy_lab.read_file(OFFLOAD, "/etc/kvops/lmcache.yaml") == before


def test_a_key_the_engine_ignores_fails_the_play_with_the_engines_log_line(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    # The operator vouches for a key (vllm_lmcache_extra_known_keys) that this LMCache does not
    # read: the engine starts, logs "Unknown configuration key" and the role fails on that line.
    bad = {
        "vllm_lmcache_config": {"gds_io_threads": 8},
        "vllm_lmcache_extra_known_keys": ["gds_io_threads"],
    }
    try:
        proc = run_deploy(deploy_lab, wheel_vars, limit=OFFLOAD, extra_vars=bad)
        assert proc.returncode != 0
        assert "LMCache fell back silently" in proc.stdout, explain(proc)
        assert "Unknown configuration key: gds_io_threads" in proc.stdout, explain(proc)
    finally:
        restored = run_deploy(deploy_lab, wheel_vars, limit=OFFLOAD)
        assert restored.returncode == 0, explain(restored)


def test_an_engine_that_never_gets_healthy_fails_the_play_with_its_log(
    deploy_lab: LabHosts, wheel_vars: dict[str, Any], deployed: subprocess.CompletedProcess[str]
) -> None:
    stuck = "/usr/local/bin/kvops-test-never-healthy"
    deploy_lab.write_file(
        BASELINE,
        stuck,
        "#!/bin/sh\necho 'never-healthy double: loading weights forever'\nexec sleep 600\n",
        mode="0755",
    )
    never = {"vllm_lmcache_engine_command": stuck, "vllm_lmcache_health_timeout_s": 6}
    try:
        proc = run_deploy(deploy_lab, wheel_vars, limit=BASELINE, extra_vars=never)
        assert proc.returncode != 0
        assert "did not become healthy" in proc.stdout, explain(proc)
        assert "never-healthy double: loading weights forever" in proc.stdout, explain(proc)
    finally:
        restored = run_deploy(deploy_lab, wheel_vars, limit=BASELINE)
        assert restored.returncode == 0, explain(restored)


def _smoke(lab: LabHosts, host: str) -> tuple[int, dict[str, Any]]:
    """`kvops smoke --host H -i INV --json`: the chunk files are read over SSH (become)."""
    here = Path(__file__).parent
    argv = [str(Path(sys.executable).parent / "kvops"), "smoke", "--host", host, "--json"]
    for source in (lab.inventory_path, SITE_VARS, DEPLOY_VARS, here / "validate_lab_vars.yml"):
        argv += ["-i", str(source)]
    # 8,192 tokens: at the lab engine's --time-scale 0.05 a 1,024-token cold TTFT is ~8 ms, so a
    # re-send's 20 % drop would be judged at the client's noise floor; 4,096 gave ~20 ms, which
    # a loaded CI machine still blurred. Smoke's default 3 prompts (the median) and fresh prompts
    # (no --seed), so that a `timing` rerun is not served from the first run's chunks.
    argv += ["--prompt-tokens", "8192"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=lab.env(), timeout=600)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.timing  # its exit status includes the TTFT drop
def test_smoke_over_ssh_passes_on_the_offload_host(
    deploy_lab: LabHosts, deployed: subprocess.CompletedProcess[str]
) -> None:
    code, doc = _smoke(deploy_lab, OFFLOAD)
    assert code == 0, json.dumps(doc["items"], indent=1)
    assert doc["evidence"]["gds_dir"] == f"{OFFLOAD}:{GDS_DIR}"
    assert doc["evidence"]["new_files"], "no new chunk file was seen over SSH"


def test_smoke_over_ssh_fails_offload_not_configured_on_the_baseline_host(
    deploy_lab: LabHosts, deployed: subprocess.CompletedProcess[str]
) -> None:
    code, doc = _smoke(deploy_lab, BASELINE)
    assert code == 1
    offload = next(i for i in doc["items"] if i["name"] == "offload")
    assert offload["status"] == "FAIL"
    assert offload["message"].startswith("offload not configured")


def test_validate_on_deployed_hosts(
    deploy_lab: LabHosts, deployed: subprocess.CompletedProcess[str]
) -> None:
    """No FAIL on the offload host; the baseline host's LMCache checks report the baseline role."""
    here = Path(__file__).parent
    argv = [str(Path(sys.executable).parent / "kvops"), "validate", "--json"]
    for source in (
        deploy_lab.inventory_path,
        SITE_VARS,
        here / "validate_lab_vars.yml",
        DEPLOY_VARS,
    ):
        argv += ["-i", str(source)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=deploy_lab.env(), timeout=600)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    hosts = json.loads(proc.stdout)["hosts"]
    for name in (OFFLOAD, BASELINE):
        fails = [f for f in hosts[name]["findings"] if f["severity"] == "FAIL"]
        assert fails == [], f"{name}: " + json.dumps(fails, indent=1)
    baseline_notes = [
        f["message"] for f in hosts[BASELINE]["findings"] if "baseline" in f["message"]
    ]
    assert baseline_notes, json.dumps(hosts[BASELINE]["findings"], indent=1)[:4000]


# The embedded engines' settings of `kvops ab-test --scale 0.05` (kvops.abtest.embedded), so the
# deployed engine models the same scaled GPU: the prefixes overflow its KV cache.
SCALE = 0.05
AB_ENGINE_ARGS = [
    "--gpu", "h100-sxm-80gb", "--storage", "ontap-nfs-rdma-200g",
    "--time-scale", "0.5", "--kv-capacity-scale", str(SCALE),
]  # fmt: skip


# The preset's shape with fewer requests per segment (the lab's engine and the client share two
# cores with everything else): the same prefix structure and prompt lengths as
# `multi-shared-prefix`. The no-gain presets' verdicts are tested where they cost less, on the
# embedded engines (tests/integration/test_abtest_sim.py) and on a real vLLM
# (tests/engine/test_abtest_engine.py); here `--deploy` is proven once, on the preset that gains.
LAB_WORKLOADS: dict[str, dict[str, Any]] = {
    "multi-shared-prefix": {
        "num_prefixes": 20, "prefix_tokens": 28000, "prompt_tokens": 30000,
        "output_tokens": 64, "batch_size": 40, "iterations": 2, "seed": 0,
    },
}  # fmt: skip


def _ab_test_deploy(
    lab: LabHosts, wheel_vars: dict[str, Any], scenario: str, out: Path, trials: int = 2
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    spec = {
        "name": scenario,
        "description": f"{scenario}, fewer requests",
        **LAB_WORKLOADS[scenario],
    }
    spec_path = out.parent / f"workload-{scenario}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    argv = [str(Path(sys.executable).parent / "kvops"), "ab-test", "--deploy", "--limit", OFFLOAD]
    for source in (lab.inventory_path, SITE_VARS, DEPLOY_VARS):
        argv += ["-i", str(source)]
    deploy_vars = {**wheel_vars, "vllm_lmcache_extra_args": AB_ENGINE_ARGS}
    for key, value in deploy_vars.items():
        argv += ["--deploy-var", f"{key}={json.dumps(value)}"]
    argv += ["--workload", str(spec_path), "--scale", str(SCALE), "--trials", str(trials)]
    argv += ["--out", str(out), "--json"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=lab.env(), timeout=1200, cwd=lab.repo_root
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, json.loads(proc.stdout)


def _deploys(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "deploys.jsonl").read_text().splitlines()]


@pytest.mark.timing  # the verdict rests on TTFTs and throughput measured beside the other groups
def test_ab_test_deploy_shows_the_offload_gain_on_many_shared_prefixes(
    deploy_lab: LabHosts,
    wheel_vars: dict[str, Any],
    deployed: subprocess.CompletedProcess[str],
    tmp_path: Path,
) -> None:
    out = tmp_path / "ab-multi"
    # Four trials: the verdict's interval is a paired Student-t over trial-level deltas, and with
    # two trials (1 degree of freedom, t = 12.7) even a large, real gain rarely clears zero when
    # the deployed engine and the client share two busy cores; with four, t = 3.2.
    _, doc = _ab_test_deploy(deploy_lab, wheel_vars, "multi-shared-prefix", out, trials=4)
    multi = doc["scenarios"]["multi-shared-prefix"]
    assert multi["verdict"] == "helps", json.dumps(multi["comparisons"], indent=1)[:3000]
    tput = next(c for c in multi["comparisons"] if c["metric"] == "total_token_throughput_tok_s")
    assert tput["ci95_low_pct"] > 0
    deploys = _deploys(out)
    # one deploy per arm before reading its info, the arm measured first (baseline) last and
    # measured on that deploy; then one per segment (4 trials x 2 arms, ABBA ABBA)
    info_deploys = ["offload", "baseline"]
    segment_deploys = ["baseline", "offload", "offload", "baseline"] * 2
    assert [d["variant"] for d in deploys] == [*info_deploys, *segment_deploys[1:]]
    assert all(d["status"] == "successful" and d["clear_gds_dir"] for d in deploys)
    offload = next(d for d in deploys if d["variant"] == "offload")["deployed"][OFFLOAD]
    assert offload["lmcache_config"]["gds_path"] == GDS_DIR
    assert offload["packages"]["kvops"] == "0.1.0"


def test_a_failed_deploy_stops_ab_test_with_the_plays_error(
    deploy_lab: LabHosts,
    wheel_vars: dict[str, Any],
    deployed: subprocess.CompletedProcess[str],
    tmp_path: Path,
) -> None:
    out = tmp_path / "ab-bad"
    argv = [str(Path(sys.executable).parent / "kvops"), "ab-test", "--deploy", "--limit", OFFLOAD]
    for source in (deploy_lab.inventory_path, SITE_VARS, DEPLOY_VARS):
        argv += ["-i", str(source)]
    bad = {**wheel_vars, "vllm_lmcache_config": {"chunk_sise": 512}}
    for key, value in bad.items():
        argv += ["--deploy-var", f"{key}={json.dumps(value)}"]
    argv += ["--scenario", "unique-one-shot", "--scale", str(SCALE), "--out", str(out)]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=deploy_lab.env(), timeout=600
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert 'did you mean "chunk_size"' in proc.stderr, proc.stderr[-3000:]
        # the offload arm is deployed first (for its info; baseline, measured first, goes
        # last) and its deploy fails: the run stops there, nothing measured
        assert [(d["variant"], d["status"]) for d in _deploys(out)] == [("offload", "failed")]
        assert not (out / "records.jsonl").exists() or not (out / "records.jsonl").read_text()
    finally:
        restored = run_deploy(deploy_lab, wheel_vars, limit=OFFLOAD)
        assert restored.returncode == 0, explain(restored)


def test_validate_fails_two_offload_hosts_sharing_the_store_with_other_chunk_sizes(
    deploy_lab: LabHosts,
    wheel_vars: dict[str, Any],
    deployed: subprocess.CompletedProcess[str],
    tmp_path: Path,
) -> None:
    """kvlab-2 deployed as a second offload host on the same export path (the mount double
    shows both as the same NFS export), with chunk_size 512 against kvlab-1's 256: every
    chunk key differs, no host would hit on the other's chunks, and validate FAILs GDS-090 on
    both, naming the chunk size. kvlab-2 is the baseline host again afterwards."""
    second = {"vllm_lmcache_variant": "offload", "vllm_lmcache_chunk_size": 512}
    offload_role = tmp_path / "second-offload.yml"
    offload_role.write_text(
        yaml.safe_dump({"all": {"hosts": {BASELINE: {"kvops_role": "offload"}}}})
    )
    here = Path(__file__).parent
    argv = [str(Path(sys.executable).parent / "kvops"), "validate", "--json"]
    for source in (
        deploy_lab.inventory_path, SITE_VARS, here / "validate_lab_vars.yml", DEPLOY_VARS,
        offload_role,
    ):  # fmt: skip
        argv += ["-i", str(source)]
    try:
        proc = run_deploy(deploy_lab, wheel_vars, limit=BASELINE, extra_vars=second)
        assert proc.returncode == 0, explain(proc)
        judged = subprocess.run(
            argv, capture_output=True, text=True, env=deploy_lab.env(), timeout=600
        )
        assert judged.returncode == 1, judged.stderr[-3000:]
        hosts = json.loads(judged.stdout)["hosts"]
        for name in (OFFLOAD, BASELINE):
            [agreement] = [f for f in hosts[name]["findings"] if f["check_id"] == "GDS-090"]
            assert agreement["severity"] == "FAIL", agreement
            assert "chunk_size: '256' (kvlab-1) vs '512' (kvlab-2)" in agreement["message"]
    finally:
        restored = run_deploy(deploy_lab, wheel_vars, limit=BASELINE)
        assert restored.returncode == 0, explain(restored)
