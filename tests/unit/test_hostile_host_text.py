"""Text a compromised host (or anyone who can reach the vLLM port, whose request paths land in
the service log) hands kvops: every parser, judge and the redactor stays linear in time and
bounded in memory, and what a finding shows of such text is bounded.

No wall-clock assertions (house rule): a per-test `timeout` fails a regression to quadratic
time, generously above what the linear code needs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from evidence_builders import edited, file_item, findings_for, healthy
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.checks import ALL_CHECKS, Context, Finding, Thresholds
from kvops.parse._common import (
    MAX_LINE_CHARS,
    MAX_SHOWN_CHARS,
    clip,
    looks_like_prompt,
    version_tuple,
)
from kvops.parse.cufile import parse_cufile
from kvops.parse.gdscheck import parse_gdscheck
from kvops.parse.gdsio import parse_gdsio
from kvops.parse.host_yaml import MAX_YAML_CHARS, HostYamlError, load_host_yaml
from kvops.parse.ip_addr import parse_ip_addr
from kvops.parse.lmcache_config import effective_lmcache_config
from kvops.parse.mounts import parse_mounts
from kvops.parse.mountstats import pnfs_layouts
from kvops.parse.nvfs_stats import parse_nvfs_stats
from kvops.parse.nvidia_smi import parse_nvidia_proc_version, parse_nvidia_smi_csv
from kvops.parse.pci_acs import parse_acs
from kvops.parse.prometheus import parse_prometheus_text
from kvops.parse.rdma_tools import parse_ibdev2netdev, parse_show_gids
from kvops.parse.topo import parse_topo
from kvops.probe.redact import MAX_LINE_CHARS as REDACT_MAX_LINE_CHARS
from kvops.probe.redact import redact_text, redact_value

# "Billion laughs": 416 bytes that expand to 10^9 list members through aliases.
LAUGHS = (
    "a: &a ["
    + ",".join(["lol"] * 9)
    + "]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n"
        for i in range(8)
    )
)


@pytest.mark.timeout(20)
def test_yaml_aliases_are_refused() -> None:
    with pytest.raises(HostYamlError, match="aliases are refused"):
        load_host_yaml(LAUGHS)
    with pytest.raises(HostYamlError, match="anchor &b"):
        load_host_yaml("base: &b {chunk_size: 256}\n")
    with pytest.raises(HostYamlError, match=r"alias \*b"):
        load_host_yaml("other: *b\n")
    assert load_host_yaml("chunk_size: 256\ngds_path: /mnt/gds\n") == {
        "chunk_size": 256,
        "gds_path": "/mnt/gds",
    }


@pytest.mark.timeout(20)
def test_yaml_size_and_depth_are_capped() -> None:
    with pytest.raises(HostYamlError, match="larger than"):
        load_host_yaml("a: " + "x" * MAX_YAML_CHARS)
    with pytest.raises(HostYamlError, match="nest"):
        load_host_yaml("[" * 60000)
    with pytest.raises(HostYamlError, match="nest"):
        load_host_yaml("".join("  " * i + "- \n" for i in range(200)))
    with pytest.raises(HostYamlError):
        load_host_yaml("a: " + "1" * 20000)  # int() refuses > 4300 digits: an error, no raise


@pytest.mark.timeout(20)
def test_billion_laughs_is_a_finding_not_a_hang() -> None:
    config = effective_lmcache_config(LAUGHS)
    assert config.error is not None and "alias" in config.error
    doc = edited(lmcache_config=file_item("/etc/lmcache/gds.yaml", LAUGHS))
    [(severity, message)] = findings_for(doc, "GDS-064")
    assert severity == "FAIL" and "alias" in message


@pytest.mark.timeout(20)
def test_vllm_config_file_with_aliases_is_reported() -> None:
    doc = healthy()
    process = doc["items"]["vllm_process"]["data"]
    for key in ("argv", "serving_argv"):
        if isinstance(process.get(key), list):
            process[key] = [a for a in process[key] if "kv" not in a and not a.startswith("{")]
    doc["items"].pop("vllm_unit", None)
    doc["items"]["vllm_config_file"] = file_item("/etc/vllm/config.yaml", LAUGHS)
    [(severity, message)] = findings_for(doc, "GDS-072")
    assert severity == "FAIL" and "alias" in message


def test_clip_marks_the_cut() -> None:
    assert clip("short") == "short"
    long = clip("x" * 5000)
    assert long.startswith("x" * MAX_SHOWN_CHARS) and "truncated" in long
    assert len(long) < MAX_SHOWN_CHARS + 40


def _lengths(doc: dict[str, Any], check_id: str) -> list[int]:
    return [len(message) for _, message in findings_for(doc, check_id)]


@pytest.mark.timeout(20)
def test_finding_messages_bound_host_values() -> None:
    huge = "z" * 10_000  # four of them stay under the YAML size cap
    text = f"chunk_size: {huge}\ngds_backend: {huge}\n? {huge}\n: 1\nmax_local_cpu_size: {huge}\n"
    text += f"gds_path: /{huge}\n"
    doc = edited(lmcache_config=file_item("/etc/lmcache/gds.yaml", text))
    for check_id in ("GDS-060", "GDS-061", "GDS-064", "GDS-065"):
        assert max(_lengths(doc, check_id)) < 2000, check_id
    config = effective_lmcache_config(text)
    assert all(len(w) < 2000 for w in config.warnings)
    assert all(len(v) < 2000 for v in config.unconverted.values())
    cufile = json.dumps({"properties": {huge: 1, "max_direct_io_size_kb": huge}})
    doc = edited(cufile_json=file_item("/etc/cufile.json", cufile))
    for check_id in ("GDS-031", "GDS-034"):
        assert max(_lengths(doc, check_id)) < 2000, check_id
    doc = healthy()
    doc["items"]["vllm_env"]["data"]["env"]["PROMETHEUS_MULTIPROC_DIR"] = huge
    doc["items"]["vllm_env"]["data"]["env"]["PYTHONHASHSEED"] = huge
    for check_id in ("GDS-062", "GDS-063"):
        assert max(_lengths(doc, check_id)) < 2000, check_id


def run_checks(doc: dict[str, Any]) -> list[Finding]:
    """Every check on one host's evidence, without the validate path's guard that turns a
    crashing check into a finding: here a crash fails the test."""
    context = Context(doc, Thresholds())
    return [found for check in ALL_CHECKS for found in check(context)]


# --- linear time on hostile lines ----------------------------------------------------------
MIB = 1024 * 1024
# Runs that made a former pattern backtrack (spaces, digits, '=', ':', '@', '[', a name with no
# value, repeated prefixes of a pattern), each after the prefixes that get a line past the
# first test of some parser.
UNITS = [" ", "9", "=", ":", "@", "[", "a", "-a", "a=", "0.", "(", '"', "\t ", "port 1 (",
         "api_key=[", "token", "http", "GPU "]  # fmt: skip
PREFIXES = ["", "x ", "GPU 0000:01:00.0 uuid:", "ACSCtl:\t", "NVRM version: Kernel Module",
            "mlx5_0 ", "a on ", "IoType: ", "nfsv4: ", "api_key: ", "--api-key ",
            "x://"]  # fmt: skip


def hostile_texts() -> list[str]:
    """Per unit: 1 MiB of lines as long as a parser reads (MAX_LINE_CHARS), after each prefix
    in turn, then one 1 MiB line."""
    texts = []
    for unit in UNITS:
        run = unit * (MAX_LINE_CHARS // len(unit))
        lines = [PREFIXES[i % len(PREFIXES)] + run for i in range(MIB // MAX_LINE_CHARS)]
        texts.append("\n".join(lines) + "\n" + unit * (MIB // len(unit)) + "\n")
    return texts


TARGETS: dict[str, Callable[[str], Any]] = {
    "looks_like_prompt": lambda t: [looks_like_prompt(ln) for ln in t.splitlines()],
    "version_tuple": lambda t: [version_tuple(ln) for ln in t.splitlines()],
    "parse_cufile": parse_cufile,
    "parse_gdscheck": parse_gdscheck,
    "parse_gdsio": parse_gdsio,
    "parse_ip_addr": parse_ip_addr,
    "parse_mounts": parse_mounts,
    "pnfs_layouts": pnfs_layouts,
    "parse_nvfs_stats": parse_nvfs_stats,
    "parse_nvidia_proc_version": parse_nvidia_proc_version,
    "parse_nvidia_smi_csv": parse_nvidia_smi_csv,
    "parse_acs": parse_acs,
    "parse_prometheus_text": parse_prometheus_text,
    "parse_ibdev2netdev": parse_ibdev2netdev,
    "parse_show_gids": parse_show_gids,
    "parse_topo": parse_topo,
    "effective_lmcache_config": lambda t: effective_lmcache_config(t, {"LMCACHE_CHUNK_SIZE": t}),
    "redact_text": redact_text,
    "redact_value": lambda t: redact_value({"k": t.splitlines()[:8]}),
}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return hostile_texts()


@pytest.mark.timeout(30)  # ~3 s on a loaded 2-core machine; the former code took minutes
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_parsers_and_redactor_are_linear_on_hostile_lines(name: str, texts: list[str]) -> None:
    for text in texts:
        TARGETS[name](text)


def _lines(line: str, header: str = "") -> str:
    """1 MiB of `line` repeated, each after `header`."""
    return "".join(header + line + "\n" for _ in range(MIB // len(line)))


@pytest.mark.timeout(20)
def test_format_specific_hostile_lines() -> None:
    """Lines that reach the patterns behind a format's own first test: lspci ACS flags under a
    device header, nvidia-smi CSV units and suffixes, an RDMA port's rate."""
    parse_acs(_lines("\tACSCtl:\t" + "a" * MAX_LINE_CHARS, "00:01.0 PCI bridge: X\n"))
    parse_nvidia_smi_csv(" " * MAX_LINE_CHARS + "\n" + _lines("1" + " " * MAX_LINE_CHARS + "x"))
    parse_nvidia_smi_csv("[" * MAX_LINE_CHARS + "\n" + _lines("[" * MAX_LINE_CHARS + "x"))
    parse_gdscheck("GPU INFO:\n" + _lines("GPU index 0 x" + " bar:1" * (MAX_LINE_CHARS // 6)))
    pnfs_layouts(
        "device a mounted on /m with fstype nfs4\n" + _lines(" nfsv4: " + ", pnfs=" * 2048)
    )
    doc = healthy()
    for device in doc["items"]["infiniband"]["data"]["devices"]:
        for port in device["ports"]:
            port["rate"] = "9" * MIB
    run_checks(doc)


@pytest.mark.timeout(20)
def test_redactor_cuts_long_lines_and_still_redacts() -> None:
    line = "api_key=sk-secret-1 " + "x" * MIB
    out = redact_text(line + "\npassword: hunter2\n")
    assert "sk-secret-1" not in out and "hunter2" not in out
    assert len(out) < 2 * REDACT_MAX_LINE_CHARS and "cut by the redactor" in out
    assert redact_text(out) == out


@pytest.mark.timeout(60)
def test_judges_are_linear_on_hostile_evidence(texts: list[str]) -> None:
    """Every text item of a host's evidence replaced by hostile text: every check judges it."""
    for text in texts[:: len(texts) // 4]:
        doc = healthy()
        for item in doc["items"].values():
            if isinstance(item.get("stdout"), str):
                item["stdout"] = text
        for infiniband in [doc["items"].get("infiniband", {}).get("data") or {}]:
            for device in infiniband.get("devices", []):
                for port in device.get("ports", []):
                    port["rate"] = text[:MIB]
        run_checks(doc)


# The prompt pattern before it was made linear: still the reference on short lines.
FORMER_PROMPT = re.compile(r"^\s*(\[[^\]]*\]|\S*[@:]\S*\s*|[\w.\-]+)?[$#]\s+\S")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="$# \t@:[]ab.-~/1é", max_size=14))
def test_prompt_test_agrees_with_the_former_pattern(line: str) -> None:
    assert looks_like_prompt(line) == bool(FORMER_PROMPT.match(line))
