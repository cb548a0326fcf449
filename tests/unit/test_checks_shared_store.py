"""Offload hosts sharing one GDS directory, judged across the fleet (GDS-090..092), and the
directory's fill level (GDS-083). Evidence: the healthy NetApp host (tests/evidence_builders.py)
copied per host, with one recorded-format item edited per case."""

from __future__ import annotations

import copy
import json
from typing import Any

import evidence_builders as eb
import pytest

from kvops.checks import Severity
from kvops.checks.catalog import fleet_check_ids
from kvops.checks.shared_store import judge_shared_stores, store_key
from kvops.validate.judge import judge, judge_fleet

STORE = "192.168.10.101:/trident_pvc_ae477c5c_cf10_4bc0_bb71_39d214a237f0/lmcache"


def host(name: str, prunes: bool = False) -> dict[str, Any]:
    """A copy of the healthy host named `name`; only a pruning host keeps its active timer."""
    doc = copy.deepcopy(eb.healthy())
    doc["host"] = name
    if not prunes:
        doc["items"]["gds_prune_timer"]["stdout"] = eb.prune_show(active=False)
    return doc


def lmcache_yaml(doc: dict[str, Any], text: str) -> dict[str, Any]:
    doc["items"]["lmcache_config"]["stdout"] = text
    return doc


def serve_argv(doc: dict[str, Any], *extra: str, model: str = eb.MODEL) -> dict[str, Any]:
    argv = ["/opt/vllm/bin/vllm", "serve", model, "--kv-transfer-config", eb.KV_TRANSFER, *extra]
    doc["items"]["vllm_process"]["data"]["argv"] = argv
    return doc


def results(*docs: dict[str, Any]) -> dict[str, dict[str, tuple[str, str]]]:
    """host → check id → (severity, message)."""
    return {
        name: {f.check_id: (str(f.severity), f.message) for f in findings}
        for name, findings in judge_shared_stores(docs).items()
    }


def test_hosts_that_agree_pass_and_one_pruner_is_enough() -> None:
    out = results(host("a", prunes=True), host("b"), host("c"))
    for name in "abc":
        assert set(out[name]) == fleet_check_ids()
        assert out[name]["GDS-090"][0] == "PASS"
        assert STORE in out[name]["GDS-090"][1] and "a, b, c" in out[name]["GDS-090"][1]
        assert out[name]["GDS-091"][0] == "PASS"
        assert out[name]["GDS-092"] == ("PASS", f"{STORE} pruned by a (kvops-gds-prune.timer)")


@pytest.mark.parametrize(
    ("edit", "label"),
    [
        (lambda d: lmcache_yaml(d, eb.LMCACHE_YAML.replace("256", "512")), "chunk_size: '256'"),
        (
            lambda d: lmcache_yaml(
                d, eb.LMCACHE_YAML + "pre_caching_hash_algorithm: sha256_cbor\n"
            ),
            "hash_algorithm: 'builtin' (a) vs 'sha256_cbor' (b)",
        ),
        (lambda d: serve_argv(d, model="/models/llama-8b"), "model: '/models/llama-8b' (b)"),
        (
            lambda d: d["items"]["vllm_env"]["data"]["env"].update(PYTHONHASHSEED="42") or d,
            "PYTHONHASHSEED: '0' (a) vs '42' (b)",
        ),
        (
            lambda d: d["items"]["gds_dir"]["data"].update(service_uid=1001) or d,
            "service uid: '1001' (b) vs '990' (a)",
        ),
        (
            lambda d: d["items"]["gds_dir"]["data"].update(service_gid=1001) or d,
            "service gid: '1001' (b) vs '990' (a)",
        ),
    ],
)
def test_hosts_sharing_a_directory_that_disagree_fail(edit: Any, label: str) -> None:
    out = results(host("a", prunes=True), edit(host("b")))
    for name in "ab":
        severity, message = out[name]["GDS-090"]
        assert severity == "FAIL", message
        assert label in message and "shared by a, b" in message


def test_a_different_tp_layout_is_a_separate_cache_not_a_failure() -> None:
    out = results(host("a", prunes=True), serve_argv(host("b"), "--tensor-parallel-size", "2"))
    severity, message = out["b"]["GDS-090"]
    assert severity == "WARN" and "tensor_parallel_size: '1' (a) vs '2' (b)" in message


def test_hosts_on_different_directories_are_not_compared() -> None:
    other = lmcache_yaml(host("b"), eb.LMCACHE_YAML.replace("256", "512"))
    other["items"]["gds_dir"]["data"]["resolved_paths"] = {"/mnt/other": "/mnt/other"}
    other["settings"]["gds_dir"] = "/mnt/other"
    lmcache_yaml(
        other, other["items"]["lmcache_config"]["stdout"].replace(eb.GDS_DIR, "/mnt/other")
    )
    out = results(host("a", prunes=True), other)
    assert out["a"]["GDS-090"] == ("PASS", f"no other host of this run shares {STORE}")
    assert out["b"]["GDS-090"][0] == "PASS"
    assert out["b"]["GDS-092"][0] == "WARN"  # nobody prunes /mnt/other
    assert "no host of this run prunes" in out["b"]["GDS-092"][1]


def test_a_store_nobody_prunes_warns_and_two_pruners_warn() -> None:
    none = results(host("a"), host("b"))
    assert none["a"]["GDS-092"][0] == "WARN"
    both = results(host("a", prunes=True), host("b", prunes=True))
    assert (
        both["a"]["GDS-092"][0] == "WARN" and "pruned by 2 hosts (a, b)" in both["a"]["GDS-092"][1]
    )


def test_a_timer_pruning_another_directory_does_not_count() -> None:
    pruner = host("a")
    pruner["items"]["gds_prune_timer"]["stdout"] = eb.prune_show(active=True, directory="/srv")
    out = results(pruner, host("b"))
    assert out["a"]["GDS-092"][0] == "WARN"
    assert "a: kvops-gds-prune.timer loaded/enabled/active prunes /srv" in (
        judge_shared_stores([pruner, host("b")])["a"][2].evidence
    )


def test_an_old_bundle_without_the_timer_item_skips() -> None:
    old = host("a")
    del old["items"]["gds_prune_timer"]
    assert results(old)["a"]["GDS-092"][0] == "SKIP"


def test_a_shared_local_disk_path_fails() -> None:
    yaml = eb.LMCACHE_YAML + "local_disk: file:///mnt/local-disk/\nmax_local_disk_size: 5\n"
    out = results(lmcache_yaml(host("a", prunes=True), yaml), lmcache_yaml(host("b"), yaml))
    severity, message = out["a"]["GDS-091"]
    assert severity == "FAIL" and "shared with b" in message
    alone = results(lmcache_yaml(host("a", prunes=True), yaml))
    assert alone["a"]["GDS-091"][0] == "PASS"
    inside = eb.LMCACHE_YAML + f"local_disk: file://{eb.GDS_DIR}/disk/\n"
    inner = results(lmcache_yaml(host("a", prunes=True), inside))["a"]["GDS-091"]
    assert inner[0] == "FAIL" and "inside its own GDS directory" in inner[1]


def test_baseline_and_unreachable_hosts() -> None:
    baseline = host("base")
    baseline["settings"]["role"] = "baseline"
    out = judge_shared_stores([baseline, eb.unreachable()])
    assert {f.severity for f in out["base"]} == {Severity.SKIP}
    assert "unreachable" not in out


def test_a_local_gds_directory_is_not_shared() -> None:
    doc = host("a")
    doc["items"]["mounts"]["stdout"] = "/dev/nvme0n1p1 /mnt ext4 rw,relatime 0 0\n"
    out = results(doc)
    assert out["a"]["GDS-090"][0] == "SKIP" and "not on an NFS mount" in out["a"]["GDS-090"][1]


def test_store_key_is_the_export_path_below_the_mount() -> None:
    from kvops.checks.context import Context
    from kvops.checks.model import Thresholds

    ctx = Context(eb.healthy(), Thresholds())
    assert store_key(ctx, eb.GDS_DIR) == STORE
    assert store_key(ctx, "/mnt") == STORE.rsplit("/", 1)[0]
    assert store_key(ctx, "/var/tmp") is None


def test_judge_fleet_adds_the_fleet_findings_under_each_host() -> None:
    fleet = judge_fleet([host("a", prunes=True), serve_argv(host("b"), model="other")])
    assert fleet.exit_code() == 1
    failed = [f for f in fleet.findings["b"] if f.severity is Severity.FAIL]
    assert [(f.check_id, f.host) for f in failed] == [("GDS-090", "b")]


def test_hostile_values_are_clipped_in_messages() -> None:
    long_model = "m" * 5000
    out = results(host("a", prunes=True), serve_argv(host("b"), model=long_model))
    assert out["b"]["GDS-090"][0] == "FAIL"
    assert len(out["b"]["GDS-090"][1]) < 2000


@pytest.mark.parametrize(
    ("free", "total", "expected"),
    [(500, 1024, "PASS"), (100, 1024, "WARN"), (0, 0, "SKIP")],
)
def test_fill_threshold(free: int, total: int, expected: str) -> None:
    doc = eb.healthy()
    doc["items"]["gds_dir"]["data"].update(free_bytes=free * 2**30, total_bytes=total * 2**30)
    [(severity, message)] = eb.findings_for(doc, "GDS-083")
    assert severity == expected, message
    if expected == "WARN":
        assert "90.2% full" in message and "above 85%" in message


def test_models_root_is_the_fallback_model_string() -> None:
    doc = host("b")
    del doc["items"]["vllm_process"]
    doc["items"]["vllm_unit"]["stdout"] = "[Service]\nExecStart=/usr/bin/wrapper\n"
    body = {"data": [{"id": "served", "root": "/models/other"}]}
    doc["items"]["http_models"]["stdout"] = json.dumps(body)
    out = results(host("a", prunes=True), doc)
    assert "model: '/models/other' (b)" in out["b"]["GDS-090"][1]


def test_judge_alone_has_no_fleet_ids() -> None:
    assert not {f.check_id for f in judge(eb.healthy())} & fleet_check_ids()


def mp_host(name: str, *server_flags: str) -> dict[str, Any]:
    """An offload_mp host: vLLM with LMCacheMPConnector, `lmcache server` run by its unit."""
    doc = host(name)
    doc["settings"]["lmcache_server_service"] = "lmcache.service"
    connector = '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}'
    argv = ["/opt/vllm/bin/vllm", "serve", eb.MODEL, "--kv-transfer-config", connector]
    doc["items"]["vllm_process"]["data"]["argv"] = argv
    server = " ".join(["/opt/kvops/vllm-venv/bin/lmcache", "server", *server_flags])
    doc["items"]["lmcache_server_unit_show"] = eb.command(
        ["systemctl", "show", "--no-pager", "lmcache.service", "-p", "ActiveState,ExecStart"],
        f"ActiveState=active\nExecStart={{ path=/opt/kvops/vllm-venv/bin/lmcache ; "
        f"argv[]={server} ; ignore_errors=no }}\n",
        synthetic=True,
    )
    return doc


def test_server_mode_hosts_compare_the_servers_chunk_size_and_hash() -> None:
    same = results(mp_host("a", "--chunk-size", "256"), mp_host("b", "--chunk-size", "256"))
    assert same["a"]["GDS-090"][0] == "PASS"
    assert same["a"]["GDS-092"][0] == "SKIP"  # the L2 adapter's layout: not kvops gds prune's
    out = results(
        mp_host("a", "--hash-algorithm", "blake3"), mp_host("b", "--hash-algorithm", "sha256_cbor")
    )
    severity, message = out["b"]["GDS-090"]
    assert severity == "FAIL" and "hash_algorithm: 'blake3' (a) vs 'sha256_cbor' (b)" in message
    mixed = results(host("a", prunes=True), mp_host("b"))
    assert mixed["b"]["GDS-090"][0] == "FAIL"  # builtin (in-process) vs the server's default


def test_saved_bundles_judged_as_a_fleet() -> None:
    """fleet/: the healthy host prunes the directory all share; broken/: nobody does."""
    from kvops.validate.judge import load_evidence

    def by_host(bundle: str) -> dict[str, set[tuple[str, str]]]:
        fleet = judge_fleet(load_evidence(eb.EVIDENCE_DIR / bundle))
        return {
            h: {(f.check_id, str(f.severity)) for f in fs if f.check_id in fleet_check_ids()}
            for h, fs in fleet.findings.items()
        }

    whole = by_host("fleet")
    assert whole.pop("unreachable") == set()
    expected = {("GDS-090", "PASS"), ("GDS-091", "PASS"), ("GDS-092", "PASS")}
    assert all(found == expected for found in whole.values()), whole
    broken = by_host("broken")
    assert all(("GDS-092", "WARN") in found for found in broken.values()), broken


def test_hosts_mounting_one_svm_through_different_lifs_share_its_store() -> None:
    """With ONTAP read (`--ontap`), the mount's server is the SVM that owns the LIF address."""
    from kvops.checks.ontap import lif_owners

    other_lif = host("b")
    mounts = other_lif["items"]["mounts"]
    mounts["stdout"] = mounts["stdout"].replace("192.168.10.101:/", "192.168.10.102:/")
    lmcache_yaml(other_lif, eb.LMCACHE_YAML.replace("256", "512"))
    apart = results(host("a", prunes=True), other_lif)
    assert apart["b"]["GDS-090"][0] == "PASS"  # two servers as far as the mounts say
    cluster = {
        "host": "ontap-cluster-01",
        "cluster": {"name": "c1"},
        "svm": "svm_kv",
        "lifs": [
            {"name": "lif1", "ip": {"address": "192.168.10.101"}},
            {"name": "lif2", "ip": {"address": "192.168.10.102"}},
        ],
    }
    owners = lif_owners(cluster)
    assert owners == {"192.168.10.101": "c1/svm_kv", "192.168.10.102": "c1/svm_kv"}
    out = judge_shared_stores([host("a", prunes=True), other_lif], owners)
    [agreement] = [f for f in out["b"] if f.check_id == "GDS-090"]
    assert agreement.severity is Severity.FAIL
    assert agreement.message.startswith("c1/svm_kv:/trident_pvc_")
    assert "chunk_size: '256' (a) vs '512' (b)" in agreement.message
