"""Hosts and variables exactly as Ansible resolves them (real `ansible-inventory`), plus the
connection and kvops settings read from them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvops.remote.inventory import (
    InventoryError,
    InventoryHost,
    Jump,
    ansible_inventory_exe,
    hosts_from_list,
    load_inventory,
    parse_proxy_jump,
    probe_options,
    probe_settings,
)

# Runs in the lab-own group's process (tests/tiers.py): no timing verdict.
pytestmark = pytest.mark.beside_lab_own

VAULT_PASSWORD = "kvops-test-vault-password"


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inv")
    hosts = {
        "all": {
            "vars": {"kvops_vllm_url": "http://127.0.0.1:8000"},
            "children": {
                "gpu_hosts": {
                    "children": {
                        "offload": {"hosts": {"gpu-01": None, "gpu-02": None}},
                        "baseline": {"hosts": {"gpu-03": None}},
                    }
                },
                "storage": {"hosts": {"ontap-a": {"ansible_connection": "local"}}},
            },
        }
    }
    (root / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (root / "group_vars").mkdir()
    (root / "group_vars" / "gpu_hosts.yml").write_text(
        yaml.safe_dump(
            {
                "ansible_user": "ops",
                "ansible_become": "yes",
                "ansible_ssh_common_args": "-o ProxyJump=jump@bastion.example:2222",
                "kvops_gds_dir": "/mnt/ontap/gds",
                "kvops_vllm_service": "vllm-offload.service",
            }
        )
    )
    (root / "host_vars").mkdir()
    (root / "host_vars" / "gpu-01.yml").write_text(
        yaml.safe_dump(
            {
                "ansible_host": "10.0.0.11",
                "ansible_port": 2200,
                "ansible_ssh_private_key_file": "~/.ssh/gpu_ed25519",
                "ansible_python_interpreter": "/usr/bin/python3.8",
                "kvops_gdsio_size": "4G",
                "kvops_probe_roots": {"proc": "/recorded/proc", "bogus": "/x"},
                "kvops_probe_tool_dirs": "/opt/doubles",
                "kvops_probe_command_timeout_s": "45",
            }
        )
    )
    pw = root / "vault-pass"
    pw.write_text(VAULT_PASSWORD + "\n")
    secret = subprocess.run(
        [
            str(Path(ansible_inventory_exe()).with_name("ansible-vault")),
            "encrypt_string",
            "--vault-password-file",
            str(pw),
            "s3cret",
            "--name",
            "ansible_become_password",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (root / "host_vars" / "gpu-02.yml").write_text(secret)
    return root


def names(hosts: list[InventoryHost]) -> list[str]:
    return sorted(h.name for h in hosts)


def vault(inventory: Path) -> list[str]:
    return [str(inventory / "vault-pass")]


@pytest.fixture(scope="module")
def resolved(inventory: Path) -> dict[str, InventoryHost]:
    """The whole inventory, once (ansible-inventory costs about a second per call)."""
    return {
        h.name: h for h in load_inventory([str(inventory)], vault_password_files=vault(inventory))
    }


def test_limit_patterns_behave_as_in_ansible(inventory: Path) -> None:
    # names, groups, globs, exclusion, intersection, ':' and ',' lists (passed to --limit)
    cases = {
        "gpu-0*,!gpu-02,storage": ["gpu-01", "gpu-03", "ontap-a"],
        "gpu_hosts:&offload": ["gpu-01", "gpu-02"],
        "baseline:gpu-01": ["gpu-01", "gpu-03"],
    }
    for pattern, expected in cases.items():
        assert names(load_inventory([str(inventory)], limit=pattern)) == expected, pattern


def test_group_and_host_vars_give_connection_settings(inventory: Path) -> None:
    hosts = {
        h.name: h for h in load_inventory([str(inventory)], vault_password_files=vault(inventory))
    }
    gpu1 = hosts["gpu-01"]
    assert (gpu1.address, gpu1.port, gpu1.user) == ("10.0.0.11", 2200, "ops")
    assert gpu1.key_file == str(Path("~/.ssh/gpu_ed25519").expanduser())
    assert gpu1.become and gpu1.become_user == "root" and gpu1.become_method == "sudo"
    assert gpu1.python == "/usr/bin/python3.8"
    assert gpu1.jumps == [Jump(host="bastion.example", port=2222, user="jump")]
    assert "offload" in gpu1.groups and "gpu_hosts" in gpu1.groups
    gpu3 = hosts["gpu-03"]
    assert (gpu3.address, gpu3.port, gpu3.python) == ("gpu-03", 22, "python3")
    assert hosts["ontap-a"].connection == "local" and not hosts["ontap-a"].become


def test_vaulted_variables_are_decrypted_with_the_password_file(
    inventory: Path, resolved: dict[str, InventoryHost]
) -> None:
    assert resolved["gpu-02"].become_password == "s3cret"
    (locked,) = load_inventory([str(inventory)], limit="gpu-02")  # never prompts
    assert locked.become_password is None
    assert locked.warnings == [
        "ansible_become_password is vaulted and no --vault-password-file was given"
    ]


def test_kvops_settings_from_host_vars_with_documented_defaults(inventory: Path) -> None:
    hosts = {
        h.name: h for h in load_inventory([str(inventory)], vault_password_files=vault(inventory))
    }
    s1 = probe_settings(hosts["gpu-01"], storage_bench=True, gdsio={"io_size": "4M", "size": ""})
    assert s1["gds_dir"] == "/mnt/ontap/gds"
    assert s1["vllm_url"] == "http://127.0.0.1:8000"
    assert s1["vllm_service"] == "vllm-offload.service"
    assert s1["role"] == "offload" and s1["storage_bench"] is True
    assert s1["gdsio_args"] == {"size": "4G", "io_size": "4M", "threads": "8", "gpu": "0"}
    assert "service_user" not in s1 and "lmcache_config_path" not in s1
    assert probe_settings(hosts["gpu-03"])["role"] == "baseline"
    opts = probe_options(hosts["gpu-01"])
    assert opts == {
        "roots": {"proc": "/recorded/proc"},
        "tool_dirs": ["/opt/doubles"],
        "command_timeout_s": 45.0,
    }
    assert probe_options(hosts["gpu-03"]) == {}


def test_explicit_role_var_wins_over_group() -> None:
    host = InventoryHost("h", groups=["baseline"], vars={"kvops_role": "offload"})
    assert probe_settings(host)["role"] == "offload"


def test_role_none_declares_no_inference_service_and_a_host_free_space_floor() -> None:
    host = InventoryHost("h", groups=["offload"], vars={"kvops_role": "None"})
    assert probe_settings(host)["role"] == "none"
    assert "min_free_gib" not in probe_settings(host)
    host.vars["kvops_min_free_gib"] = "0.5"
    assert probe_settings(host)["min_free_gib"] == 0.5


def test_unknown_role_and_bad_free_space_floor_warn() -> None:
    data = {
        "_meta": {"hostvars": {"h": {"kvops_role": "offlaod", "kvops_min_free_gib": "lots"}}},
        "all": {"children": ["ungrouped"]},
        "ungrouped": {"hosts": ["h"]},
    }
    (h,) = hosts_from_list(data)
    assert any("kvops_role 'offlaod' unknown" in w for w in h.warnings), h.warnings
    assert any("kvops_min_free_gib 'lots'" in w for w in h.warnings), h.warnings
    settings = probe_settings(h)
    assert settings["role"] == "offload" and "min_free_gib" not in settings


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-J", "a"], [Jump("a")]),
        (["-Jops@a:2022,b"], [Jump("a", 2022, "ops"), Jump("b")]),
        (["-o", "ProxyJump=ssh://u@[fd00::1]:23"], [Jump("fd00::1", 23, "u")]),
        (["-oProxyJump none"], []),
        (["-o", "StrictHostKeyChecking=yes"], []),
    ],
)
def test_proxy_jump_forms(args: list[str], expected: list[Jump]) -> None:
    assert parse_proxy_jump(args) == expected


def test_proxy_command_known_hosts_and_ssh_extra_args() -> None:
    host = InventoryHost(
        "h",
        vars={
            "ansible_ssh_common_args": "-o 'ProxyCommand=ssh -W %h:%p bastion' "
            "-o UserKnownHostsFile=~/lab/known_hosts",
            "ansible_ssh_extra_args": "-o ConnectTimeout=5",
        },
    )
    assert host.proxy_command == "ssh -W %h:%p bastion"
    assert host.jumps == []
    assert host.known_hosts_file == str(Path("~/lab/known_hosts").expanduser())
    assert InventoryHost("h").known_hosts_file is None


def test_bad_inventory_and_no_match_are_inventory_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InventoryError, match="does not exist"):
        load_inventory([str(tmp_path / "missing")])
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts: [a\n")
    with pytest.raises(InventoryError, match=r"bad\.yml"):
        load_inventory([str(bad)])
    good = tmp_path / "good.yml"
    good.write_text("all:\n  hosts:\n    a:\n")
    with pytest.raises(InventoryError, match="no hosts matched by the pattern 'zzz'"):
        load_inventory([str(good)], limit="zzz")
    # no source: Ansible's configured inventory, as ansible-inventory itself reads it
    monkeypatch.delenv("ANSIBLE_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./ansible.cfg naming one
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "none.cfg"))
    with pytest.raises(InventoryError, match="No inventory was parsed"):
        load_inventory([])
    monkeypatch.setenv("ANSIBLE_INVENTORY", str(good))
    assert [h.name for h in load_inventory([])] == ["a"]


def test_comma_host_list_and_unrendered_templates() -> None:
    (host,) = load_inventory(["gpu-77,"])
    assert host.name == "gpu-77" and host.address == "gpu-77"
    data = {
        "_meta": {"hostvars": {"h": {"ansible_host": "{{ inventory_hostname }}.lan"}}},
        "all": {"children": ["ungrouped"]},
        "ungrouped": {"hosts": ["h"]},
    }
    (h,) = hosts_from_list(data)
    assert h.warnings and "ansible_host" in h.warnings[0]


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("kvops_probe_command_timeout_s", "20s", "command_timeout_s = '20s' is not a number"),
        ("kvops_probe_bench_timeout_s", -1, "must be >= 0.1"),
        ("kvops_gdsio_threads", "eight", "kvops_gdsio_threads = 'eight' is not a whole number"),
        ("ansible_port", "22x", "ansible_port = '22x' is not a whole number"),
        ("ansible_port", 70000, "is not a TCP port"),
        ("ansible_ssh_common_args", "-J jump:ssh", "port 'ssh' is not a TCP port"),
    ],
)
def test_bad_values_are_usage_errors_naming_host_and_variable(
    var: str, value: Any, message: str
) -> None:
    host = InventoryHost("gpu-07", vars={var: value})
    with pytest.raises(InventoryError) as caught:
        probe_options(host)
        probe_settings(host)
        assert host.port and host.jumps is not None
    assert message in str(caught.value) and caught.value.rc == 2
    if var != "ansible_ssh_common_args":  # a hop is named by itself
        assert str(caught.value).startswith("gpu-07: ")


def test_a_vaulted_group_vars_file_without_a_password_names_the_ways_to_give_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped example encrypts whole group_vars files: ansible-inventory cannot read them
    at all without a secret, and the error says how to give one (never prompts)."""
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    example = Path(__file__).parents[2] / "inventories" / "example"
    with pytest.raises(InventoryError, match="--vault-password-file or --vault-id, or set"):
        load_inventory([str(example)], limit="gpu-node-01")
