"""The vllm_lmcache role's offload_mp variant (LMCache's multiprocess server) on a lab host:
its default settings pass the role's own checks in a real play (the role's filter plugins and
flag list loaded by Ansible, as on a production host), and a server flag the pinned
`lmcache server` does not take, an adapter type it does not register, a GDS L1 slab on the
shared export or a transfer mode that is not one of its choices fail the play before anything
changes, with a message that names the problem.

And a converge of offload_mp on a lab host whose service manager double runs the real unit
files: the role writes the server's unit and environment, starts it before vLLM (whose unit
requires it), waits for its /healthcheck, reads its log of this start; a second run and a
--check --diff run change nothing; switching to offload stops and removes the server's unit.
The server there is a test double (tests/lab/doubles/lmcache-server: the flags the role renders,
/healthcheck, /metrics) and vLLM is `kvops sim serve`; the KV path itself (store, retrieve, a
hit from the file tier after restarting both) runs on the real LMCache in the engine tier
(tests/engine/test_lmcache_mp_engine.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_lab import GDS_DIR, make_service_account, run_deploy, served_wheelhouse
from lab_harness import LabHosts
from site_lab import HERE, REPO_ROOT, SITE_VARS, explain, failure_messages, recap, run_role

pytestmark = [pytest.mark.lab, pytest.mark.own_lab, pytest.mark.own_lab_b]

MP = {
    "vllm_lmcache_variant": "offload_mp",
    "vllm_lmcache_model": "llama-3.1-8b",
    "vllm_lmcache_gds_dir": "/mnt/kvcache/gds",
}


@pytest.fixture(scope="module")
def mp_lab(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    return lab_factory(hosts=1, name_prefix="kvmp")


def test_the_default_offload_mp_settings_pass_the_roles_checks(
    mp_lab: LabHosts, tmp_path: Path
) -> None:
    name = mp_lab.names[0]
    playbook = tmp_path / "validate-offload-mp.yml"
    playbook.write_text(
        "---\n- name: Check the offload_mp settings as the role does before any change\n"
        "  hosts: gpu_hosts\n  gather_facts: false\n  tasks:\n"
        "    - name: Validate the role's arguments and run its checks\n"
        "      ansible.builtin.include_role:\n        name: vllm_lmcache\n"
        "        tasks_from: validate\n"
    )
    proc = mp_lab.ansible_playbook(
        playbook,
        "-i",
        str(SITE_VARS),
        limit=name,
        extra_vars=MP,
        env={"ANSIBLE_ROLES_PATH": str(REPO_ROOT / "roles")},
    )
    assert proc.returncode == 0, explain(proc)
    assert "Check the lmcache server flags against LMCache 0.5.6" in proc.stdout, explain(proc)
    assert recap(proc)[name]["changed"] == 0


CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown-flag",
        {"vllm_lmcache_mp_extra_args": ["--l1-size-gib", "4"]},
        '"--l1-size-gib" is not a flag of lmcache server 0.5.6 (did you mean "--l1-size-gb"?)',
    ),
    (
        "unknown-adapter",
        {"vllm_lmcache_mp_l2_adapters": [{"type": "nixl", "base_path": "/mnt/kvcache/gds"}]},
        'L2 adapter 0 has type "nixl", not one of LMCache\'s',
    ),
    (
        "gds-l1-on-the-export",
        {"vllm_lmcache_mp_gds_l1_path": "/mnt/kvcache/gds/slab"},
        "vllm_lmcache_mp_gds_l1_path must be an absolute directory on local NVMe",
    ),
    (
        "transfer-mode-choice",
        {"vllm_lmcache_mp_transfer_mode": "lmcache-driven"},
        "vllm_lmcache_mp_transfer_mode must be one of: auto, engine_driven, lmcache_driven",
    ),
]


@pytest.mark.parametrize(
    ("extra_vars", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_setting_the_server_would_refuse_fails_before_anything_changes(
    mp_lab: LabHosts, tmp_path: Path, extra_vars: dict[str, Any], expected: str
) -> None:
    name = mp_lab.names[0]
    proc = run_role(mp_lab, tmp_path, "vllm_lmcache", limit=name, extra_vars={**MP, **extra_vars})
    assert proc.returncode != 0, explain(proc)
    fatal = failure_messages(proc)
    assert expected in fatal, f"{expected!r} not in:\n{fatal}\n{explain(proc)}"
    assert recap(proc)[name]["changed"] == 0


DEPLOYED = "kvmpd-1"
SERVER_DOUBLE = "/usr/local/bin/kvops-test-lmcache-server-double"
SERVER_LOG = "/var/log/kvops-test-doubles/units/lmcache.service.log"
MP_DEPLOY = {
    "vllm_lmcache_variant": "offload_mp",
    "vllm_lmcache_mp_command": f"{SERVER_DOUBLE} server",
    "vllm_lmcache_mp_log_file": SERVER_LOG,
    "kvops_role": "offload",
}


@pytest.fixture(scope="module")
def deploy_host(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    return lab_factory(hosts=1, name_prefix="kvmpd", variants={DEPLOYED: {"SYSTEMD": "double"}})


@pytest.fixture(scope="module")
def wheel_vars(
    deploy_host: LabHosts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    with served_wheelhouse(deploy_host, tmp_path_factory.mktemp("wheelhouse")) as extra:
        yield extra


def _deploy(
    lab: LabHosts, wheel_vars: dict[str, Any], check: bool = False, **extra: Any
) -> subprocess.CompletedProcess[str]:
    return run_deploy(
        lab, wheel_vars, check=check, diff=check, limit=DEPLOYED, extra_vars={**MP_DEPLOY, **extra}
    )


@pytest.fixture(scope="module")
def mp_deployed(
    deploy_host: LabHosts, wheel_vars: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    # What site.yml (nfs_rdma_mount) leaves: the service account with its fixed ids and the
    # GDS directory it owns; and the server double where a virtualenv would have lmcache.
    lab = deploy_host
    make_service_account(lab, DEPLOYED)
    lab.ssh(
        DEPLOYED, ["install", "-d", "-o", "vllm", "-g", "vllm", "-m", "0750", GDS_DIR], sudo=True
    )
    double = (HERE / "doubles" / "lmcache-server").read_text()
    lab.write_file(DEPLOYED, SERVER_DOUBLE, double, mode="0755")
    proc = _deploy(lab, wheel_vars)
    assert proc.returncode == 0, explain(proc)
    return proc


def test_offload_mp_converges_with_the_server_as_its_own_unit(
    deploy_host: LabHosts, mp_deployed: subprocess.CompletedProcess[str]
) -> None:
    lab = deploy_host
    assert "mp_server | Wait for the server's /healthcheck" in mp_deployed.stdout
    assert "mp_check_log | Fail on a server failure in its log" in mp_deployed.stdout
    unit = lab.read_file(DEPLOYED, "/etc/systemd/system/lmcache.service")
    assert f"ExecStart={SERVER_DOUBLE} server --host 127.0.0.1 --port 5555" in unit
    assert "User=vllm" in unit and f"RequiresMountsFor={GDS_DIR}" in unit
    vllm_unit = lab.read_file(DEPLOYED, "/etc/systemd/system/vllm.service")
    assert "Requires=lmcache.service" in vllm_unit and "After=lmcache.service" in vllm_unit
    env = lab.read_file(DEPLOYED, "/etc/kvops/lmcache.env")
    assert "LMCACHE_TRACK_USAGE=false" in env
    connector = json.loads(lab.read_file(DEPLOYED, "/etc/kvops/kv-transfer-config.json"))
    assert connector["kv_connector"] == "LMCacheMPConnector"
    assert connector["kv_connector_extra_config"] == {
        "lmcache.mp.host": "tcp://127.0.0.1",
        "lmcache.mp.port": 5555,
    }
    assert lab.ssh(DEPLOYED, ["test", "-e", "/etc/kvops/lmcache.yaml"], check=False).returncode
    [started] = lab.doubles_log(DEPLOYED, "lmcache-server")
    argv = json.loads(started)
    assert argv[argv.index("--supported-transfer-mode") + 1] == "auto"
    adapter = json.loads(argv[argv.index("--l2-adapter") + 1])
    assert adapter == {"type": "fs", "base_path": GDS_DIR}
    assert "kvops: starting lmcache" in lab.read_file(DEPLOYED, SERVER_LOG)


def test_a_second_run_and_check_mode_change_nothing(
    deploy_host: LabHosts,
    wheel_vars: dict[str, Any],
    mp_deployed: subprocess.CompletedProcess[str],
) -> None:
    again = _deploy(deploy_host, wheel_vars)
    assert again.returncode == 0, explain(again)
    assert recap(again)[DEPLOYED]["changed"] == 0, explain(again)
    check = _deploy(deploy_host, wheel_vars, check=True)
    assert check.returncode == 0, explain(check)
    assert recap(check)[DEPLOYED]["changed"] == 0, explain(check)
    assert len(deploy_host.doubles_log(DEPLOYED, "lmcache-server")) == 1  # never restarted


def test_validate_reads_the_servers_health_metrics_and_log(
    deploy_host: LabHosts, mp_deployed: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """`kvops validate` on the offload_mp host: LMCache's checks read the server's own
    /healthcheck, /metrics (lmcache_mp_*, its L2 adapter active) and log of this start, not
    vLLM's. (The GDS stack's checks are not asserted: this host has had no site.yml.)"""
    server_vars = tmp_path / "mp-validate-vars.yml"
    settings = {
        "kvops_role": "offload",
        "kvops_lmcache_server_service": "lmcache.service",
        "kvops_lmcache_server_url": "http://127.0.0.1:8080",
    }
    server_vars.write_text(yaml.safe_dump({"all": {"hosts": {DEPLOYED: settings}}}))
    argv = [str(Path(sys.executable).parent / "kvops"), "validate", "--json"]
    for source in (
        deploy_host.inventory_path, SITE_VARS, HERE / "validate_lab_vars.yml",
        HERE / "deploy_lab_vars.yml", server_vars,
    ):  # fmt: skip
        argv += ["-i", str(source)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=deploy_host.env(), timeout=600)
    assert proc.stdout.strip(), proc.stderr[-2000:]
    findings = {f["check_id"]: f for f in json.loads(proc.stdout)["hosts"][DEPLOYED]["findings"]}
    server = findings["GDS-073"]
    assert server["severity"] == "PASS", server
    assert "lmcache_mp_* present, 1 active L2 adapter(s)" in server["message"], server
    log = findings["GDS-066"]
    assert log["severity"] == "PASS" and "no LMCache fallback" in log["message"], log
    # two logs judged: vLLM's and the server's ("<vLLM lines> + <server lines> log lines")
    assert " + " in log["message"], log


def test_switching_to_offload_removes_the_server(
    deploy_host: LabHosts,
    wheel_vars: dict[str, Any],
    mp_deployed: subprocess.CompletedProcess[str],
) -> None:
    proc = _deploy(deploy_host, wheel_vars, vllm_lmcache_variant="offload")
    assert proc.returncode == 0, explain(proc)
    for path in ("/etc/systemd/system/lmcache.service", "/etc/kvops/lmcache.env"):
        assert deploy_host.ssh(DEPLOYED, ["test", "-e", path], check=False).returncode, path
    assert "lmcache.service" not in deploy_host.read_file(
        DEPLOYED, "/etc/systemd/system/vllm.service"
    )
    calls = deploy_host.doubles_log(DEPLOYED, "systemctl")
    assert any("stop" in c and "lmcache" in c for c in calls), calls


def test_a_failure_in_the_servers_log_fails_the_start_check(
    deploy_host: LabHosts,
    wheel_vars: dict[str, Any],
    mp_deployed: subprocess.CompletedProcess[str],
) -> None:
    line = (
        "LMCache ERROR: No handler registered for operation register_kv_cache_engine_driven_context"
    )
    proc = _deploy(
        deploy_host,
        wheel_vars,
        vllm_lmcache_mp_env={"KVOPS_TEST_LMCACHE_SERVER_SAYS": line},
    )
    assert proc.returncode != 0, explain(proc)
    fatal = failure_messages(proc)
    assert "lmcache (lmcache server) runs but its log shows a failure" in fatal, explain(proc)
    assert line in fatal, fatal
