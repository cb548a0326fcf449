"""Lab naming, addressing and client files: pure rendering, no root needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvops.cli import main
from kvops.lab.config import LabConfig
from kvops.lab.errors import LabError
from kvops.lab.inject import render_variant
from kvops.lab.inventory import (
    ClientHost,
    read_declarations,
    render_hosts_yml,
    render_known_hosts,
    render_ssh_config,
)

HOSTS = [
    ClientHost("kvlab-1", "10.200.0.11", "ssh-ed25519 AAAAone"),
    ClientHost("kvlab-2", "10.200.0.12", "ssh-ed25519 AAAAtwo"),
]
KEY = Path("/inv/.ssh/id_ed25519")
KNOWN = Path("/inv/.ssh/known_hosts")


def test_slots_never_share_bridge_subnet_or_namespaces() -> None:
    a, b = LabConfig(slot=0), LabConfig(slot=3)
    assert (a.bridge, a.gateway_ip, a.host_ip(1), a.netns(1)) == (
        "kvopsbr0",
        "10.200.0.1",
        "10.200.0.11",
        "kvops0-kvlab-1",
    )
    assert b.host_ip(2) == "10.200.3.12" and b.netns(2) == "kvops3-kvlab-2"
    assert all(len(LabConfig(slot=31).veth(i)) <= 15 for i in range(1, 51))


@pytest.mark.parametrize(
    "kwargs", [{"slot": 32}, {"hosts": 0}, {"name_prefix": "bad prefix"}, {"name_prefix": "1x"}]
)
def test_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LabConfig(**kwargs)  # type: ignore[arg-type]


def test_inventory_puts_hosts_in_gpu_hosts_with_strict_host_key_checking() -> None:
    doc = yaml.safe_load(render_hosts_yml(HOSTS, key_path=KEY, known_hosts=KNOWN))
    lab_vars = doc["all"]["vars"]
    assert lab_vars["ansible_connection"] == "ssh"
    assert lab_vars["ansible_ssh_private_key_file"] == str(KEY)
    assert lab_vars["ansible_ssh_common_args"] == (
        f"-o UserKnownHostsFile={KNOWN} -o StrictHostKeyChecking=yes"
    )
    hosts = doc["all"]["children"]["gpu_hosts"]["hosts"]
    assert hosts == {
        "kvlab-1": {"ansible_host": "10.200.0.11"},
        "kvlab-2": {"ansible_host": "10.200.0.12"},
    }


def test_inventory_merges_host_and_group_vars_and_refuses_unknown_hosts() -> None:
    text = render_hosts_yml(
        HOSTS,
        key_path=KEY,
        known_hosts=KNOWN,
        host_vars={"kvlab-2": {"nvidia_driver_package": "nvidia-driver-580"}},
        group_vars={"ansible_become": True},
    )
    doc = yaml.safe_load(text)
    assert doc["all"]["vars"]["ansible_become"] is True
    host2 = doc["all"]["children"]["gpu_hosts"]["hosts"]["kvlab-2"]
    assert host2 == {"ansible_host": "10.200.0.12", "nvidia_driver_package": "nvidia-driver-580"}
    with pytest.raises(ValueError, match="kvlab-9"):
        render_hosts_yml(HOSTS, key_path=KEY, known_hosts=KNOWN, host_vars={"kvlab-9": {}})


def test_known_hosts_lists_each_key_for_name_and_address() -> None:
    assert render_known_hosts(HOSTS) == (
        "kvlab-1,10.200.0.11 ssh-ed25519 AAAAone\nkvlab-2,10.200.0.12 ssh-ed25519 AAAAtwo\n"
    )


def test_ssh_config_verifies_host_keys_against_the_lab_file() -> None:
    text = render_ssh_config(HOSTS, key_path=KEY, known_hosts=KNOWN)
    assert text.count("StrictHostKeyChecking yes") == 2
    assert f"UserKnownHostsFile {KNOWN}" in text
    assert "Host kvlab-2\n  HostName 10.200.0.12\n" in text


def test_variant_file_refuses_unknown_keys_and_odd_values() -> None:
    assert render_variant({"RDMA": "down"}).endswith("RDMA=down\n")
    with pytest.raises(LabError, match="RDAM"):
        render_variant({"RDAM": "down"})
    with pytest.raises(LabError, match="active, down, none"):
        render_variant({"RDMA": "x; rm -rf /"})
    # gdscheck has no switch any more: it answers from the host's state
    with pytest.raises(LabError, match="GDSCHECK"):
        render_variant({"GDSCHECK": "compat"})
    assert "SYSTEMD=double" in render_variant({"RDMA": "active", "SYSTEMD": "double"})


def test_cli_bad_name_prefix_is_a_usage_error_without_traceback() -> None:
    result = CliRunner().invoke(main, ["lab", "up", "--name-prefix", "no spaces"])
    assert result.exit_code == 2
    assert "name prefix" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["up", "down"])
def test_cli_without_root_says_why_in_one_line(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setattr("kvops.lab.lab.os.geteuid", lambda: 1000)
    result = CliRunner().invoke(main, ["lab", command])
    assert result.exit_code == 2  # could not run
    assert "the lab cannot run here: not root" in result.output
    assert "Traceback" not in result.output


def test_lab_subnet_conflicts_are_found_on_other_interfaces_only() -> None:
    from kvops.lab.net import address_conflicts

    out = (
        "1: lo    inet 127.0.0.1/8 scope host lo\n"
        "2: eth0    inet 10.200.0.5/16 brd 10.200.255.255 scope global eth0\n"
        "7: kvopsbr0    inet 10.200.0.1/24 scope global kvopsbr0\n"
        "8: kvopsbr1    inet 10.200.1.1/24 scope global kvopsbr1\n"
    )
    assert address_conflicts(out, "kvopsbr0", "10.200.0.") == ["eth0 10.200.0.5/16"]
    assert address_conflicts(out, "kvopsbr2", "10.200.2.") == []


LAB_TESTS = Path(__file__).resolve().parents[1] / "lab"


def test_lab_vars_files_go_into_hosts_yml_for_hosts_of_this_lab_only() -> None:
    """`kvops lab up` reads tests/lab's two vars files: `-i inventories/lab` alone carries
    the role settings (per host too) and the declarations kvops validate needs."""
    declared = read_declarations(
        [LAB_TESTS / "site_lab_vars.yml", LAB_TESTS / "validate_lab_vars.yml"]
    )
    assert declared.group_vars["nfs_rdma_mount_export_address"] == "192.0.2.50"
    assert declared.group_vars["kvops_role"] == "none"
    assert declared.host_vars["kvlab-2"]["rdma_client_stack"] == "doca-ofed"
    text = render_hosts_yml(
        HOSTS[:1],
        key_path=KEY,
        known_hosts=KNOWN,
        host_vars={"kvlab-1": {"rdma_client_stack": "doca-ofed"}},
        declarations=declared,
    )
    group = yaml.safe_load(text)["all"]["children"]["gpu_hosts"]
    assert group["vars"]["kvops_gds_dir"] == "/mnt/kvcache/gds"
    assert list(group["hosts"]) == ["kvlab-1"]  # kvlab-2 is declared, but not in this lab
    assert group["hosts"]["kvlab-1"]["rdma_client_stack"] == "doca-ofed"  # explicit wins


def test_later_vars_file_wins_and_a_malformed_one_is_named(tmp_path: Path) -> None:
    first, second, bad = tmp_path / "a.yml", tmp_path / "b.yml", tmp_path / "bad.yml"
    first.write_text("all:\n  children:\n    gpu_hosts:\n      vars: {x: 1, y: 1}\n")
    second.write_text("all:\n  children:\n    gpu_hosts:\n      vars: {y: 2}\n")
    assert read_declarations([first, second]).group_vars == {"x": 1, "y": 2}
    bad.write_text("gpu_hosts:\n  vars: {x: 1}\n")
    with pytest.raises(ValueError, match=r"bad\.yml.*all\.children\.gpu_hosts"):
        read_declarations([bad])
    with pytest.raises(ValueError, match=r"missing\.yml"):
        read_declarations([tmp_path / "missing.yml"])
