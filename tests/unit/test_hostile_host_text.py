"""Text a compromised host (or anyone who can reach the vLLM port, whose request paths land in
the service log) hands kvops: every parser, judge and the redactor stays linear in time and
bounded in memory, and what a finding shows of such text is bounded.

No wall-clock assertions (house rule): a per-test `timeout` fails a regression to quadratic
time, generously above what the linear code needs.
"""

from __future__ import annotations

from typing import Any

import pytest
from evidence_builders import edited, file_item, findings_for, healthy

from kvops.parse._common import MAX_SHOWN_CHARS, clip
from kvops.parse.host_yaml import MAX_YAML_CHARS, HostYamlError, load_host_yaml
from kvops.parse.lmcache_config import effective_lmcache_config

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
    doc = healthy()
    doc["items"]["vllm_env"]["data"]["env"]["PROMETHEUS_MULTIPROC_DIR"] = huge
    doc["items"]["vllm_env"]["data"]["env"]["PYTHONHASHSEED"] = huge
    for check_id in ("GDS-062", "GDS-063"):
        assert max(_lengths(doc, check_id)) < 2000, check_id
