"""nvidia-smi CSV, /proc/driver/nvidia/version and `ip addr` parsers."""

from __future__ import annotations

import json

from kvops.parse.ip_addr import parse_ip_addr
from kvops.parse.nvidia_smi import parse_nvidia_proc_version, parse_nvidia_smi_csv

CSV = (
    "index, name, driver_version, persistence_mode, pci.bus_id, memory.total [MiB]\n"
    "0, NVIDIA H100 80GB HBM3, 550.54.15, Enabled, 00000000:18:00.0, 81559 MiB\n"
    "1, NVIDIA H100 80GB HBM3, 550.54.15, Disabled, 00000000:2A:00.0, [N/A]\n"
)


def test_csv_with_units_in_header() -> None:
    out = parse_nvidia_smi_csv(CSV)
    assert out.driver_versions == ["550.54.15"]
    assert out.gpus[0]["memory.total"] == "81559"
    assert out.gpus[1]["memory.total"] is None
    assert out.warnings == []


def test_csv_noheader_and_short_rows() -> None:
    out = parse_nvidia_smi_csv("0, 550.54.15\n1\n", columns=["index", "driver_version"])
    assert out.driver_versions == ["550.54.15"]
    assert "row" in out.warnings[0]
    assert parse_nvidia_smi_csv("").warnings == ["empty nvidia-smi output"]


def test_open_and_proprietary_module_lines() -> None:
    open_text = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
        "(dvs-builder@U16-I3-D08-1-2)  Tue Mar  5 22:23:42 UTC 2024\n"
    )
    parsed = parse_nvidia_proc_version(open_text)
    assert parsed.open_kernel_module is True and parsed.driver_version == "550.54.15"
    prop = parse_nvidia_proc_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    )
    assert prop.open_kernel_module is False and prop.driver_version == "535.104.05"
    assert parse_nvidia_proc_version("").open_kernel_module is None


def test_ip_json_and_text_forms() -> None:
    doc = [
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
        {"ifname": "ens1f0np0", "addr_info": [{"family": "inet", "local": "192.168.10.30"}]},
    ]
    assert parse_ip_addr(json.dumps(doc)).addresses["ens1f0np0"] == ["192.168.10.30"]
    text = (
        "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
        "5: net1@if9    inet 192.168.10.2/24 brd 192.168.10.255 scope global net1\n"
        "5: net1    inet6 fe80::cb0:10ff:fe34:aad/64 scope link\n"
    )
    parsed = parse_ip_addr(text)
    assert parsed.addresses["net1"] == ["192.168.10.2", "fe80::cb0:10ff:fe34:aad"]
    assert parse_ip_addr("[not json").warnings
