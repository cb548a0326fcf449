"""The vllm_lmcache role's shared store: gds_path is one directory per model revision, dtype and
TP layout; a shared local_disk is refused; one named host gets the `kvops gds prune` timer and
every other host none. Rendered with Ansible's own templar (test_vllm_lmcache_role helpers), and
the timer's unit files read back as systemd reads them."""

from __future__ import annotations

import configparser
import shlex
from typing import Any

import pytest
import yaml
from test_vllm_lmcache_role import MODEL, ROLE, _all_tasks, _render

from kvops.checks.shared_store import _pruned_directory

pytestmark = pytest.mark.unit

STORE = "llama-3.1-8b-instruct@0e9e39f-bf16-tp1"
PRUNER = {
    **MODEL,
    "vllm_lmcache_variant": "offload",
    "vllm_lmcache_gds_store": STORE,
    "vllm_lmcache_prune_host": "gpu-node-01",
    "vllm_lmcache_prune_max_bytes": "800G",
    "inventory_hostname": "gpu-node-01",
}


def _rule(words: str) -> dict[str, Any]:
    [task] = [
        t for _, t in _all_tasks() if t["name"] == "validate | Check the cross-field settings"
    ]
    [rule] = [c for c in task["vars"]["_vllm_lmcache_checks"] if words in c["msg"]]
    return dict(rule)


def test_gds_path_is_the_store_below_the_shared_directory() -> None:
    document = _render("{{ _vllm_lmcache_document }}", **PRUNER)
    assert document["gds_path"] == f"/mnt/kvcache/gds/{STORE}"
    flat = _render("{{ _vllm_lmcache_document }}", **MODEL, vllm_lmcache_variant="offload")
    assert flat["gds_path"] == "/mnt/kvcache/gds"  # no store named: the directory itself
    mp = _render("{{ vllm_lmcache_mp_l2_adapters }}", **PRUNER)
    assert mp == [{"type": "fs", "base_path": f"/mnt/kvcache/gds/{STORE}"}]


@pytest.mark.parametrize(
    ("store", "ok"),
    [(STORE, True), ("", True), ("../other", False), ("..", False), ("a/b", False), ("-x", False)],
)
def test_the_store_is_one_directory_name(store: str, ok: bool) -> None:
    rule = _rule("vllm_lmcache_gds_store must be one directory name")
    assert _render(rule["ok"], **MODEL, vllm_lmcache_gds_store=store) is ok


@pytest.mark.parametrize(
    ("local_disk", "ok"),
    [
        ("file:///mnt/kvcache/gds/disk/", False),
        ("/mnt/kvcache/gds", False),
        ("file:///local/nvme/lmcache/", True),
        ("/mnt/kvcache/gds-local/", True),
        (None, True),
    ],
)
def test_a_local_disk_on_the_shared_directory_is_refused(local_disk: str | None, ok: bool) -> None:
    rule = _rule("local_disk must not be on the shared GDS directory")
    config = {} if local_disk is None else {"local_disk": local_disk}
    assert _render(rule["ok"], **MODEL, vllm_lmcache_config=config) is ok


def test_only_the_named_host_of_an_in_process_variant_prunes() -> None:
    assert _render("{{ _vllm_lmcache_prune_here }}", **PRUNER) is True
    other = {**PRUNER, "inventory_hostname": "gpu-node-02"}
    assert _render("{{ _vllm_lmcache_prune_here }}", **other) is False
    for variant in ("baseline", "offload_mp"):
        assert (
            _render("{{ _vllm_lmcache_prune_here }}", **{**PRUNER, "vllm_lmcache_variant": variant})
            is False
        )
    gone = {**PRUNER, "vllm_lmcache_state": "absent"}
    assert _render("{{ _vllm_lmcache_prune_here }}", **gone) is False


def test_the_pruning_host_needs_a_budget() -> None:
    rule = _rule("needs a budget")
    assert _render(rule["ok"], **PRUNER) is True
    assert _render(rule["ok"], **{**PRUNER, "vllm_lmcache_prune_max_bytes": ""}) is False
    aged = {**PRUNER, "vllm_lmcache_prune_max_bytes": "", "vllm_lmcache_prune_max_age": "7d"}
    assert _render(rule["ok"], **aged) is True
    elsewhere = {**PRUNER, "vllm_lmcache_prune_max_bytes": "", "inventory_hostname": "other"}
    assert _render(rule["ok"], **elsewhere) is True  # not the pruner: no budget needed


@pytest.mark.parametrize(
    ("size", "ok"), [("800G", True), ("1.5TiB", True), ("", True), ("lots", False)]
)
def test_the_budget_is_a_size_kvops_reads(size: str, ok: bool) -> None:
    rule = _rule("vllm_lmcache_prune_max_bytes must be a size")
    assert _render(rule["ok"], **{**PRUNER, "vllm_lmcache_prune_max_bytes": size}) is ok


def _unit(template: str, **role_vars: Any) -> configparser.ConfigParser:
    text = (ROLE / "templates" / template).read_text()
    rendered = _render(text, ansible_managed="managed", **role_vars)
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(rendered)
    return parser


def test_the_prune_service_runs_kvops_gds_prune_on_the_store_as_the_service_user() -> None:
    unit = _unit("gds_prune.service.j2", **PRUNER)
    service = unit["Service"]
    assert (service["Type"], service["User"], service["Group"]) == ("oneshot", "vllm", "vllm")
    argv = shlex.split(service["ExecStart"])
    assert argv == [
        "/opt/kvops/vllm-venv/bin/kvops",
        "gds",
        "prune",
        f"/mnt/kvcache/gds/{STORE}",
        "--min-age",
        "5m",
        "--tmp-age",
        "1h",
        "--max-bytes",
        "800G",
    ]
    assert unit["Unit"]["RequiresMountsFor"] == f"/mnt/kvcache/gds/{STORE}"
    # What kvops validate reads back from `systemctl show` (GDS-092): the directory pruned.
    shown = f"{{ path={argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no }}"
    assert _pruned_directory(shown) == f"/mnt/kvcache/gds/{STORE}"


def test_the_timer_repeats_after_each_run_ends() -> None:
    timer = _unit("gds_prune.timer.j2", **PRUNER)
    assert timer["Timer"]["OnUnitInactiveSec"] == "15min"
    assert timer["Timer"]["OnActiveSec"] == "5min"
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_prune_tasks_are_modules_that_check_mode_can_predict() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "prune.yml").read_text())
    modules = {next(k for k in t if k.startswith("ansible.")) for t in tasks}
    assert modules == {
        "ansible.builtin.template",
        "ansible.builtin.systemd_service",
        "ansible.builtin.stat",
        "ansible.builtin.assert",
        "ansible.builtin.file",
    }
    included = [
        t for f, t in _all_tasks() if "prune.yml" in str(t.get("ansible.builtin.include_tasks"))
    ]
    assert len(included) == 2  # present (install or remove) and absent (remove)
