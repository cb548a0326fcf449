"""LMCache, vLLM and GDS-directory judges."""

from __future__ import annotations

import json
from typing import Any

from evidence_builders import (
    KV_TRANSFER,
    LMCACHE_YAML,
    command,
    edited,
    file_item,
    findings_for,
    healthy,
    http_item,
)

from kvops.checks import Context, Thresholds
from kvops.checks.lmcache import check_stable_hash


def env(doc: dict[str, Any]) -> dict[str, str]:
    return doc["items"]["vllm_env"]["data"]["env"]  # type: ignore[no-any-return]


def test_baseline_host_skips_lmcache_checks() -> None:
    doc = healthy()
    doc["settings"]["role"] = "baseline"
    for check_id in ("GDS-060", "GDS-061", "GDS-062", "GDS-063", "GDS-064"):
        assert findings_for(doc, check_id)[0][0] == "SKIP", check_id
    [(severity, message)] = findings_for(doc, "GDS-072")
    assert severity == "WARN" and "baseline host runs LMCacheConnectorV1" in message


def test_gds_path_from_env_on_local_disk_fails() -> None:
    doc = healthy()
    env(doc)["LMCACHE_GDS_PATH"] = "/var/tmp/kv"
    doc["items"]["mounts"]["stdout"] += "/dev/sda3 / xfs rw 0 0\n"
    [(severity, message)] = findings_for(doc, "GDS-060")
    assert severity == "FAIL" and "env LMCACHE_GDS_PATH" in message


def test_gds_path_unset_and_no_config_at_all() -> None:
    doc = edited(lmcache_config=file_item("/etc/lmcache/gds.yaml", "chunk_size: 256\n"))
    assert findings_for(doc, "GDS-060")[0][0] == "FAIL"
    gone = file_item("/etc/lmcache/gds.yaml", "", error="ENOENT")
    doc = edited(lmcache_config=gone)
    del env(doc)["LMCACHE_CONFIG_FILE"]
    [(severity, message)] = findings_for(doc, "GDS-060")
    assert severity == "FAIL" and "no LMCache config" in message
    for check_id in ("GDS-061", "GDS-062", "GDS-064"):  # one FAIL for one cause
        assert findings_for(doc, check_id)[0][0] == "SKIP"


def test_old_lmcache_needs_the_old_key() -> None:
    doc = edited(lmcache_version=command(["python"], "0.4.3\n"))
    [(severity, message)] = findings_for(doc, "GDS-061")
    assert severity == "FAIL" and "reads cufile_buffer_size" in message
    old_yaml = LMCACHE_YAML.replace("gds_buffer_size", "cufile_buffer_size")
    doc["items"]["lmcache_config"]["stdout"] = old_yaml
    assert findings_for(doc, "GDS-061")[0][0] == "PASS"


def test_unknown_lmcache_version_warns_and_missing_key_fails() -> None:
    doc = edited(lmcache_version=command(["python"], "", exit_code=1))
    assert findings_for(doc, "GDS-061")[0][0] == "WARN"
    doc = edited(lmcache_config=file_item("/x.yaml", "gds_path: /mnt/lmcache\n"))
    [(severity, message)] = findings_for(doc, "GDS-061")
    assert severity == "FAIL" and "not set" in message


def test_settings_that_turn_gds_off_fail() -> None:
    assert findings_for(healthy(), "GDS-065")[0][0] == "PASS"
    cases = [
        ("LMCACHE_USE_GDS", "yes", "use_gds is false"),  # LMCache reads only true/1 as true
        ("LMCACHE_USE_GDS", "false", "use_gds is false"),
        ("LMCACHE_GDS_BACKEND", "hipfile", "gds_backend = 'hipfile'"),
        ("LMCACHE_CHUNK_SIZE", "256 tokens", "chunk_size"),
        ("LMCACHE_EXTRA_CONFIG", '{"use_direct_io": 1}', "use_direct_io = 1"),
    ]
    for name, value, expected in cases:
        doc = healthy()
        env(doc)[name] = value
        [(severity, message)] = findings_for(doc, "GDS-065")
        assert severity == "FAIL" and expected in message, (name, value, message)
    doc = healthy()
    doc["settings"]["role"] = "baseline"
    env(doc)["LMCACHE_USE_GDS"] = "false"
    assert findings_for(doc, "GDS-065")[0][0] == "SKIP"


def test_buffer_size_that_does_not_convert_fails() -> None:
    yaml_text = LMCACHE_YAML.replace("8192", "8GiB")
    doc = edited(lmcache_config=file_item("/etc/lmcache/gds.yaml", yaml_text))
    [(severity, message)] = findings_for(doc, "GDS-061")
    assert severity == "FAIL" and "8GiB" in message


def test_hash_seed() -> None:
    doc = healthy()
    del env(doc)["PYTHONHASHSEED"]
    assert findings_for(doc, "GDS-062")[0][0] == "FAIL"
    doc["items"]["lmcache_config"]["stdout"] += "pre_caching_hash_algorithm: sha256_cbor\n"
    assert findings_for(doc, "GDS-062")[0][0] == "PASS"


def test_empty_hash_seed_is_unset() -> None:
    """CPython reads an empty PYTHONHASHSEED as unset: a random seed at every start."""
    absent = healthy()
    del env(absent)["PYTHONHASHSEED"]
    [absent_finding] = check_stable_hash(Context(absent, Thresholds()))
    for empty in ("", "  "):
        doc = healthy()
        env(doc)["PYTHONHASHSEED"] = empty
        [found] = check_stable_hash(Context(doc, Thresholds()))
        assert str(found.severity) == "FAIL" and "empty" in found.message
        assert found.remedy == absent_finding.remedy


def test_prometheus_dir_and_metrics() -> None:
    doc = healthy()
    del env(doc)["PROMETHEUS_MULTIPROC_DIR"]
    assert findings_for(doc, "GDS-063")[0][0] == "WARN"
    vllm_only = "# TYPE vllm:x gauge\nvllm:x 1\n"
    doc = edited(http_metrics=http_item("http://h/metrics", 200, vllm_only))
    assert findings_for(doc, "GDS-073")[0][0] == "WARN"


def test_misspelled_lmcache_key_warns() -> None:
    doc = healthy()
    doc["items"]["lmcache_config"]["stdout"] += "local_cpus: false\n"
    [(severity, message)] = findings_for(doc, "GDS-064")
    assert severity == "WARN" and "local_cpus" in message


def test_unhealthy_and_wrong_model() -> None:
    doc = edited(http_health=http_item("http://h/health", 503, ""))
    [(severity, message)] = findings_for(doc, "GDS-070")
    assert severity == "FAIL" and "HTTP 503" in message
    down = edited(http_health=http_item("http://h/health", None, ""))
    assert findings_for(down, "GDS-070")[0][0] == "FAIL"
    other = json.dumps({"object": "list", "data": [{"id": "other/model"}]})
    assert findings_for(edited(http_models=http_item("u", 200, other)), "GDS-071")[0][0] == "FAIL"
    junk = edited(http_models=http_item("u", 200, "<html>"))
    assert findings_for(junk, "GDS-071")[0][0] == "FAIL"


def test_connector_from_unit_file_when_process_missing() -> None:
    doc = edited(vllm_process=None)
    assert findings_for(doc, "GDS-072")[0][0] == "PASS"  # ExecStart with a \ continuation
    unit = "[Service]\nExecStart=/opt/vllm/bin/vllm serve m --port 8000\n"
    doc = edited(vllm_process=None, vllm_unit=command(["systemctl"], unit))
    [(severity, message)] = findings_for(doc, "GDS-072")
    assert severity == "FAIL" and "kv_connector=None" in message


def test_extra_config_from_kv_transfer_config_overrides_file() -> None:
    kv = json.loads(KV_TRANSFER) | {"kv_connector_extra_config": {"lmcache.gds_path": "/tmp/x"}}
    doc = healthy()
    doc["items"]["vllm_process"]["data"]["argv"][-1] = json.dumps(kv)
    doc["items"]["mounts"]["stdout"] += "tmpfs /tmp tmpfs rw 0 0\n"
    [(severity, message)] = findings_for(doc, "GDS-060")
    assert severity == "FAIL" and "kv_connector_extra_config" in message


def test_gds_dir_problems() -> None:
    doc = healthy()
    data = doc["items"]["gds_dir"]["data"]
    data.update(
        writable_by_service_user=False,
        tmp_file_count=3,
        tmp_files=["/mnt/lmcache/12/34/a.kvcache.safetensors.tmp1a2b3c4d"],
        free_bytes=2 * 2**30,
    )
    assert findings_for(doc, "GDS-080")[0][0] == "FAIL"
    [(severity, message)] = findings_for(doc, "GDS-081")
    assert severity == "WARN" and "3 leftover" in message
    assert findings_for(doc, "GDS-082") == [("FAIL", "2.0 GiB free (minimum 10 GiB)")]
    data["exists"] = False
    assert findings_for(doc, "GDS-080")[0][0] == "FAIL"
    assert findings_for(doc, "GDS-081")[0][0] == "SKIP"


def test_gds_dir_that_cannot_be_stat_ed_fails_with_the_reason() -> None:
    doc = healthy()
    doc["items"]["gds_dir"]["error"] = "cannot stat /mnt/lmcache: [Errno 2] No such file"
    doc["items"]["gds_dir"]["data"] = {"exists": False, "is_dir": False, "service_user": "vllm"}
    [(severity, message)] = findings_for(doc, "GDS-080")
    assert severity == "FAIL" and "No such file" in message


def test_partial_gds_dir_walk_still_judged() -> None:
    doc = healthy()
    doc["items"]["gds_dir"]["error"] = "directory walk stopped after 200000 entries"
    assert findings_for(doc, "GDS-082")[0][0] == "PASS"


def test_connector_with_producer_role_warns_and_version_is_shown() -> None:
    doc = healthy()
    doc["items"]["vllm_process"]["data"]["argv"][-1] = KV_TRANSFER.replace("kv_both", "kv_producer")
    [(severity, message)] = findings_for(doc, "GDS-072")
    assert severity == "WARN" and "kv_producer" in message
    assert findings_for(doc, "GDS-070") == [
        ("PASS", "http://127.0.0.1:8000/health: HTTP 200 (vLLM 0.34.0)")
    ]


INFERENCE_CHECKS = ("GDS-060", "GDS-061", "GDS-062", "GDS-063", "GDS-064")
INFERENCE_CHECKS += ("GDS-070", "GDS-071", "GDS-072", "GDS-073")


def test_host_without_inference_service_skips_vllm_and_lmcache_with_the_reason() -> None:
    """`kvops_role: none` (GDS stack provisioned, no vLLM yet): nothing to judge, no FAIL."""
    down = http_item("http://127.0.0.1:8000/health", None, "")
    doc = edited(http_health=down, http_models=None, http_metrics=None, vllm_process=None)
    doc["settings"]["role"] = "none"
    for check_id in INFERENCE_CHECKS:
        [(severity, message)] = findings_for(doc, check_id)
        assert severity == "SKIP", (check_id, message)
        assert "kvops_role none" in message and "no inference service" in message, check_id
    # The GDS stack is still judged: the directory and its free space.
    assert findings_for(doc, "GDS-080")[0][0] == "PASS"
    assert findings_for(doc, "GDS-082")[0][0] == "PASS"


def test_role_none_yet_a_vllm_answers_warns() -> None:
    doc = healthy()
    doc["settings"]["role"] = "none"
    [(severity, message)] = findings_for(doc, "GDS-070")
    assert severity == "WARN" and "answers HTTP 200" in message


def test_offload_host_without_a_running_vllm_still_fails() -> None:
    """The production verdict is unchanged: an offload host (the default) must serve."""
    down = http_item("http://127.0.0.1:8000/health", None, "")
    doc = edited(http_health=down)
    assert doc["settings"]["role"] == "offload"
    assert findings_for(doc, "GDS-070")[0][0] == "FAIL"
    doc["settings"].pop("role")
    assert findings_for(doc, "GDS-070")[0][0] == "FAIL"


def test_free_space_floor_from_the_host_beats_the_fleet_default() -> None:
    doc = healthy()
    doc["items"]["gds_dir"]["data"]["free_bytes"] = 15 * 2**20  # a 16 MiB volume
    [(severity, message)] = findings_for(doc, "GDS-082")
    assert severity == "FAIL" and message == "0.015 GiB free (minimum 10 GiB)"
    doc["settings"]["min_free_gib"] = 0.01
    [(severity, message)] = findings_for(doc, "GDS-082")
    assert severity == "PASS" and "minimum 0.01 GiB, this host's kvops_min_free_gib" in message
    doc["settings"]["min_free_gib"] = 20
    doc["items"]["gds_dir"]["data"]["free_bytes"] = 15 * 2**30
    assert findings_for(doc, "GDS-082")[0][0] == "FAIL"  # stricter per host, too


def test_service_log_warnings_fail_offload_hosts() -> None:
    assert findings_for(healthy(), "GDS-066")[0][0] == "PASS"
    line = "[t] LMCache WARNING: Unknown configuration key: gds_io_threads (source: file: /x)\n"
    doc = healthy()
    doc["items"]["vllm_journal"]["stdout"] += line
    [(severity, message)] = findings_for(doc, "GDS-066")
    assert severity == "FAIL" and "1x 'Unknown configuration key'" in message
    doc["settings"]["role"] = "baseline"
    assert findings_for(doc, "GDS-066")[0][0] == "SKIP"
    doc = edited(vllm_journal=command(["journalctl"], "", exit_code=127))
    assert findings_for(doc, "GDS-066")[0][0] == "SKIP"


# LMCache 0.5.6's own lines when its initialisation fails (no GPU connector, a cuFile
# registration error): vLLM stays healthy on /health and never offloads.
DEGRADED_LINES = (
    "[2026-12-02 13:59:04,100] LMCache ERROR: Failed to initialize LMCacheManager components: "
    "RuntimeError: No supported cpu connector found. System will operate in degraded mode "
    "(recompute). (manager.py:212:lmcache.v1.manager)\n"
    "[2026-12-02 13:59:04,101] LMCache WARNING: Skipping post_init due to previous "
    "initialization failure (manager.py:260:lmcache.v1.manager)\n"
)


def test_degraded_mode_fails_even_after_it_scrolled_out_of_the_tail() -> None:
    """Logged once at start: on a busy server the 3000-line tail no longer holds it, the
    whole run's problem lines (journalctl --grep) still do."""
    doc = healthy()
    doc["items"]["vllm_journal"]["stdout"] += DEGRADED_LINES
    [(severity, message)] = findings_for(doc, "GDS-066")
    assert severity == "FAIL" and "degraded mode" in message
    doc = healthy()
    doc["items"]["vllm_journal_problems"] = command(
        ["journalctl", "--grep", "..."], DEGRADED_LINES.split("\n")[0] + "\n"
    )
    [(severity, message)] = findings_for(doc, "GDS-066")
    assert severity == "FAIL"
    assert "1x 'Failed to initialize LMCacheManager components'" in message
    assert "without offload" in message


def test_the_probes_problem_grep_covers_every_line_the_judge_fails() -> None:
    from kvops.checks.lmcache import JOURNAL_PROBLEMS, JOURNAL_WARNINGS
    from kvops.probe.service import LMCACHE_PROBLEM_TEXTS

    needles = [needle for needle, _ in JOURNAL_PROBLEMS + JOURNAL_WARNINGS]
    assert needles == list(LMCACHE_PROBLEM_TEXTS)


def _resolved(doc: dict[str, Any], paths: dict[str, str]) -> None:
    doc["items"]["gds_dir"]["data"]["resolved_paths"] = paths


def test_symlinks_are_resolved_before_matching_a_mount() -> None:
    """`gds_path: /kv` is a link to the NFS/RDMA directory: judged where the I/O goes."""
    doc = healthy()
    doc["items"]["lmcache_config"]["stdout"] = LMCACHE_YAML.replace("/mnt/lmcache", "/kv")
    doc["items"]["mounts"]["stdout"] += "/dev/sda3 / xfs rw 0 0\n"
    assert findings_for(doc, "GDS-060")[0][0] == "FAIL"  # unresolved: on / (xfs)
    _resolved(doc, {"/mnt/lmcache": "/mnt/lmcache", "/kv": "/mnt/lmcache"})
    [(severity, message)] = findings_for(doc, "GDS-060")
    assert severity == "PASS" and "/kv (→ /mnt/lmcache)" in message


def test_a_link_from_overlay_turns_gds_off_in_lmcache() -> None:
    doc = healthy()
    doc["items"]["lmcache_config"]["stdout"] = LMCACHE_YAML.replace("/mnt/lmcache", "/kv")
    doc["items"]["mounts"]["stdout"] += "overlay / overlay rw 0 0\n"
    _resolved(doc, {"/mnt/lmcache": "/mnt/lmcache", "/kv": "/mnt/lmcache"})
    [(severity, message)] = findings_for(doc, "GDS-060")
    assert severity == "FAIL" and "turns GDS off" in message
    doc["items"]["lmcache_config"]["stdout"] += "use_gds: true\n"
    assert findings_for(doc, "GDS-060")[0][0] == "PASS"


def test_declared_gds_dir_must_be_where_lmcache_writes() -> None:
    doc = healthy()
    doc["settings"]["gds_dir"] = "/data/kv"
    doc["items"]["mounts"]["stdout"] += "/dev/sda3 / xfs rw 0 0\n"
    _resolved(doc, {"/data/kv": "/data/kv", "/mnt/lmcache": "/mnt/lmcache"})
    assert [s for s, _ in findings_for(doc, "GDS-060")] == ["PASS", "WARN"]
    _resolved(doc, {"/data/kv": "/mnt/lmcache", "/mnt/lmcache": "/mnt/lmcache"})
    assert [s for s, _ in findings_for(doc, "GDS-060")] == ["PASS"]


def test_read_only_mount_makes_the_gds_dir_unusable() -> None:
    doc = healthy()
    mounts = doc["items"]["mounts"]  # the recorded `mount` line of the ONTAP export
    mounts["stdout"] = mounts["stdout"].replace("(rw,relatime,", "(ro,relatime,")
    [(severity, message)] = findings_for(doc, "GDS-080")
    assert severity == "FAIL" and "read-only" in message


def _no_connector_in_argv(doc: dict[str, Any]) -> None:
    doc["items"]["vllm_process"]["data"]["argv"] = ["/bin/bash", "/opt/run-vllm.sh"]
    doc["items"]["vllm_unit"]["stdout"] = "[Service]\nExecStart=/bin/bash /opt/run-vllm.sh\n"


def test_connector_found_in_config_file_wrapper_and_container_child() -> None:
    doc = healthy()
    _no_connector_in_argv(doc)
    assert findings_for(doc, "GDS-072")[0][0] == "FAIL"
    kv = json.loads(KV_TRANSFER)
    config = f"model: m\nkv-transfer-config: '{json.dumps(kv)}'\n"
    doc["items"]["vllm_config_file"] = file_item("/etc/vllm/serve.yaml", config)
    [(severity, message)] = findings_for(doc, "GDS-072")
    assert severity == "PASS" and "from --config file" in message
    doc = healthy()
    _no_connector_in_argv(doc)
    script = (
        f"#!/bin/bash\nexec /opt/vllm/bin/vllm serve m \\\n  --kv-transfer-config '{KV_TRANSFER}'\n"
    )
    doc["items"]["vllm_wrapper"] = file_item("/opt/run-vllm.sh", script)
    assert "from wrapper script" in findings_for(doc, "GDS-072")[0][1]
    doc = healthy()
    data = doc["items"]["vllm_process"]["data"]
    data["argv"] = ["/usr/bin/conmon", "--cid", "abc"]
    data["serving_argv"] = ["python3", "-m", "vllm.entrypoints.openai.api_server",
                            "--kv-transfer-config", KV_TRANSFER]  # fmt: skip
    assert "from serving process" in findings_for(doc, "GDS-072")[0][1]


def test_dynamic_lmcache_connector_counts() -> None:
    dynamic = {
        "kv_connector": "LMCacheConnectorV1Dynamic",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_connector_v1",
        "kv_role": "kv_both",
    }
    doc = healthy()
    doc["items"]["vllm_process"]["data"]["argv"][-1] = json.dumps(dynamic)
    assert findings_for(doc, "GDS-072")[0][0] == "PASS"


# LMCache 0.5.6's line when its start-up scan of gds_path loses the race with its constructor
# (captured in this project's engine tier, tests/engine/test_lmcache_engine.py; path shortened)
SCAN_STOPPED_LINE = (
    "[2026-12-05 12:29:04,721] LMCache ERROR: Failed to read metadata file /mnt/kvcache/gds/71/56/"
    "%2Fmodels%2Ftiny%401%400%406350b2255f3cdd01%40float.kvcache.safetensors.metadata during GDS "
    "start; raising the error to fail startup (gds_backend.py:453:lmcache.v1.storage_backend."
    "gds_backend)\n"
)


def test_a_stopped_start_up_scan_warns_and_a_real_failure_still_fails() -> None:
    doc = healthy()
    doc["items"]["vllm_journal"]["stdout"] += SCAN_STOPPED_LINE
    [(severity, message)] = findings_for(doc, "GDS-066")
    assert severity == "WARN" and "on-demand lookups only" in message, message
    doc["items"]["vllm_journal"]["stdout"] += DEGRADED_LINES  # a FAIL outranks the warning
    assert findings_for(doc, "GDS-066")[0][0] == "FAIL"
