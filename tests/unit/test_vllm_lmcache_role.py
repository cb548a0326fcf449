"""The vllm_lmcache role: its LMCache key list agrees with `kvops validate`, a misspelled or
misplaced key is refused with the right suggestion, each variant renders the command line, LMCache
config and environment a user relies on, and the README documents every default as it is.

The role's variables are rendered with Ansible's own templar (as the play would), no host needed.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from role_files import role_vars_file

from kvops.parse.lmcache_config import known_keys

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vllm_lmcache"
KEY_DOC: dict[str, Any] = json.loads((ROLE / "files" / "lmcache_keys.json").read_text())
TYPE_NAMES = {int: "int", bool: "bool", float: "float", str: "str", dict: "dict"}

pytestmark = pytest.mark.unit


def _filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lmcache_keys", ROLE / "filter_plugins" / "lmcache_keys.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = _filters()


@pytest.mark.parametrize("version", ["0.3.9", "0.4.2", "0.4.3", "0.4.4", "0.5.6", "0.5.7rc2"])
def test_the_role_knows_the_same_keys_and_types_as_validate(version: str) -> None:
    role_keys = FILTERS.lmcache_known_keys(KEY_DOC, version)
    assert role_keys == {k: TYPE_NAMES[t] for k, t in known_keys(version).items()}


@pytest.mark.parametrize(
    ("version", "key", "closest"),
    [
        ("0.5.6", "cufile_buffer_size", "gds_buffer_size"),
        ("0.4.2", "gds_buffer_size", "cufile_buffer_size"),
        ("0.5.6", "gds_io_threads", "extra_config.disk_io_threads"),
        ("0.5.6", "chunk_sise", "chunk_size"),
        ("0.5.6", "zzz", ""),
    ],
)
def test_unknown_keys_are_named_with_what_was_meant(version: str, key: str, closest: str) -> None:
    unknown = FILTERS.lmcache_unknown_keys({key: 1}, KEY_DOC, version, [])
    assert unknown == [{"key": key, "closest": closest}]


def test_known_and_extra_keys_pass() -> None:
    config = {"chunk_size": 256, "gds_buffer_size": 8192, "cache_policy": "LRU"}
    assert FILTERS.lmcache_unknown_keys(config, KEY_DOC, "0.5.6", ["cache_policy"]) == []


def test_values_lmcache_would_misread_are_refused() -> None:
    config = {"chunk_size": "abc", "local_cpu": "false", "max_local_cpu_size": 5, "gds_path": "/x"}
    assert FILTERS.lmcache_type_errors(config, KEY_DOC, "0.5.6") == [
        "chunk_size must be int (got 'abc')",
        "local_cpu must be bool (got 'false')",
    ]


def _render(expr: str, **role_vars: Any) -> Any:
    variables: dict[str, Any] = {}
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
        variables.update(role_vars_file(path))
    variables.update(role_vars, ansible_facts={"os_family": "Debian"})
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(expr))


MODEL = {"vllm_lmcache_model": "meta-llama/Llama-3.1-8B-Instruct"}


def _argv(**role_vars: Any) -> list[str]:
    return shlex.split(_render("{{ _vllm_lmcache_exec_start }}", **MODEL, **role_vars))


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_baseline_serves_the_model_without_a_connector() -> None:
    argv = _argv(vllm_lmcache_variant="baseline")
    assert argv[:3] == ["/opt/kvops/vllm-venv/bin/vllm", "serve", MODEL["vllm_lmcache_model"]]
    assert "--kv-transfer-config" not in argv
    assert _option(argv, "--shutdown-timeout") == "30"
    env = _render("{{ _vllm_lmcache_environment }}", **MODEL, vllm_lmcache_variant="baseline")
    assert "LMCACHE_CONFIG_FILE" not in env


@pytest.mark.parametrize("variant", ["offload", "offload_cpu_gds"])
def test_offload_variants_load_lmcache_through_the_version_proof_connector(variant: str) -> None:
    argv = _argv(vllm_lmcache_variant=variant)
    assert json.loads(_option(argv, "--kv-transfer-config")) == {
        "kv_connector": "LMCacheConnectorV1Dynamic",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_connector_v1",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
    }
    env = _render("{{ _vllm_lmcache_environment }}", **MODEL, vllm_lmcache_variant=variant)
    assert env["LMCACHE_CONFIG_FILE"] == "/etc/kvops/lmcache.yaml"
    assert env["PYTHONHASHSEED"] == "0"
    assert env["LMCACHE_TRACK_USAGE"] == "false"
    assert env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["PROMETHEUS_MULTIPROC_DIR"].startswith("/var/lib/kvops-vllm/")
    assert "VLLM_SERVER_DEV_MODE" not in env


def test_every_variant_gets_the_same_kv_memory() -> None:
    memory = {}
    for variant in ("baseline", "offload", "offload_cpu_gds"):
        argv = _argv(vllm_lmcache_variant=variant, vllm_lmcache_kv_cache_memory_bytes=2**35)
        memory[variant] = [a for a in argv if a != "--kv-transfer-config" and a[:1] != "{"]
    assert memory["baseline"] == memory["offload"] == memory["offload_cpu_gds"]
    assert _option(memory["offload"], "--kv-cache-memory-bytes") == str(2**35)
    assert "--gpu-memory-utilization" not in memory["offload"]


def test_the_lmcache_config_follows_the_variant_and_the_version() -> None:
    offload = _render("{{ _vllm_lmcache_document }}", **MODEL, vllm_lmcache_variant="offload")
    assert offload["local_cpu"] is False
    assert offload["gds_path"] == "/mnt/kvcache/gds"
    assert offload["gds_buffer_size"] == 8192
    assert offload["pre_caching_hash_algorithm"] == "sha256_cbor"
    assert FILTERS.lmcache_unknown_keys(offload, KEY_DOC, "0.5.6", []) == []
    assert FILTERS.lmcache_type_errors(offload, KEY_DOC, "0.5.6") == []
    multi = _render(
        "{{ _vllm_lmcache_document }}",
        **MODEL,
        vllm_lmcache_variant="offload_cpu_gds",
        vllm_lmcache_cpu_tier_gb_per_rank=64,
    )
    assert multi["local_cpu"] is True
    assert multi["max_local_cpu_size"] == 64.0
    old = _render(
        "{{ _vllm_lmcache_document }}",
        **MODEL,
        vllm_lmcache_variant="offload",
        vllm_lmcache_lmcache_version="0.4.3",
    )
    assert old["cufile_buffer_size"] == 8192
    assert "gds_buffer_size" not in old


def test_site_settings_merge_over_the_variant() -> None:
    document = _render(
        "{{ _vllm_lmcache_document }}",
        **MODEL,
        vllm_lmcache_variant="offload",
        vllm_lmcache_config={"chunk_size": 1024, "extra_config": {"disk_io_threads": 16}},
    )
    assert document["chunk_size"] == 1024
    assert document["extra_config"] == {"use_direct_io": False, "disk_io_threads": 16}


def test_the_container_variant_bind_mounts_the_gds_dir_at_the_same_path() -> None:
    image = "docker.io/lmcache/vllm-openai@sha256:" + "a" * 64
    argv = _argv(
        vllm_lmcache_variant="offload",
        vllm_lmcache_install_method="container",
        vllm_lmcache_container_image=image,
    )
    assert argv[:2] == ["podman", "run"]
    assert "--ipc=host" in argv
    assert "/mnt/kvcache/gds:/mnt/kvcache/gds" in argv
    assert _option(argv, "--user") == "990:990"
    assert _option(argv, "--device") == "nvidia.com/gpu=all"
    assert argv[argv.index(image) + 1 : argv.index(image) + 3] == [
        "serve",
        MODEL["vllm_lmcache_model"],
    ]


def _readme_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROLE / "README.md").read_text().splitlines():
        match = re.match(r"\| `(vllm_lmcache_\w+)` \|", line)
        if match:
            cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            rows[match.group(1)] = [cell.strip() for cell in cells]
    return rows


def test_readme_and_argument_specs_document_every_default_as_it_is() -> None:
    defaults: dict[str, Any] = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    rows = _readme_rows()
    assert set(defaults) == set(options) == set(rows)
    for name, value in defaults.items():
        shown = rows[name][2]
        if isinstance(value, str) and "{{" not in value:
            assert shown == (f"`{value}`" if value else '`""`'), name
        elif isinstance(value, bool | int | float) or value in ([], {}):
            assert shown == f"`{json.dumps(value)}`", name
        else:
            assert shown == "see defaults/main.yml", name
