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


SECRETS = {"HF_TOKEN": "hf_s3cr3t-token", "VLLM_API_KEY": "sk-s3cr3t-api-key"}


def _unit_file(**role_vars: Any) -> str:
    text = (ROLE / "templates" / "vllm.service.j2").read_text()
    return str(_render(text, ansible_managed="managed", **MODEL, **role_vars))


@pytest.mark.parametrize(
    "where",
    [
        # The old way (vllm_lmcache_env with a vault value): routed by the name.
        {"vllm_lmcache_env": {**SECRETS, "LMCACHE_LOG_LEVEL": "INFO"}},
        {"vllm_lmcache_secret_env": SECRETS, "vllm_lmcache_env": {"LMCACHE_LOG_LEVEL": "INFO"}},
    ],
)
def test_secrets_go_only_to_the_secret_environment_file(where: dict[str, Any]) -> None:
    """HF_TOKEN and VLLM_API_KEY land in the secret file (0640, written with no_log), never in
    the environment file whose diff is shown, the unit file or the command line (ps)."""
    for variant in ("baseline", "offload"):
        role_vars = {"vllm_lmcache_variant": variant, **where}
        env = _render("{{ _vllm_lmcache_environment }}", **MODEL, **role_vars)
        secret = _render("{{ _vllm_lmcache_secret_environment }}", **MODEL, **role_vars)
        assert secret == SECRETS
        assert env["LMCACHE_LOG_LEVEL"] == "INFO" and not set(SECRETS) & set(env)
        unit = _unit_file(**role_vars)
        argv = " ".join(_argv(**role_vars))
        for value in SECRETS.values():
            assert value not in unit and value not in argv and value not in json.dumps(env)
        assert "EnvironmentFile=/etc/kvops/vllm.secret.env" in unit.splitlines()
        assert (
            _render("{{ _vllm_lmcache_api_key }}", **MODEL, **role_vars)
            == (SECRETS["VLLM_API_KEY"])
        )
    image = "docker.io/lmcache/vllm-openai@sha256:" + "a" * 64
    container = _argv(
        vllm_lmcache_install_method="container", vllm_lmcache_container_image=image, **where
    )
    assert "/etc/kvops/vllm.secret.env" in container  # --env-file, not -e KEY=value
    assert not any(value in " ".join(container) for value in SECRETS.values())


def _secret_file_task() -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / "present.yml").read_text())
    [task] = [t for t in tasks if t["name"] == "present | Write the secret environment file"]
    return dict(task)


def test_the_secret_file_is_the_service_groups_only_and_written_with_no_log() -> None:
    task = _secret_file_task()
    assert task["no_log"] is True
    module = task["ansible.builtin.template"]
    assert (module["owner"], module["mode"]) == ("root", "0640")
    assert module["group"] == "{{ vllm_lmcache_service_group }}"


def _all_tasks() -> list[tuple[str, dict[str, Any]]]:
    def flat(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for t in tasks:
            out.append(t)
            for part in ("block", "rescue", "always"):
                out += flat(t.get(part, []))
        return out

    return [
        (path.name, task)
        for path in sorted((ROLE / "tasks").glob("*.yml"))
        for task in flat(yaml.safe_load(path.read_text()) or [])
    ]


def test_every_task_whose_args_carry_a_secret_has_no_log() -> None:
    """A task that renders a secret into its arguments or its diff would print it with -v or
    --diff: each one has no_log (a template no_log where the secret is optional)."""
    secret_vars = re.compile(
        r"\b(_vllm_lmcache_secret_environment|_vllm_lmcache_api_key|vllm_lmcache_secret_env)\b"
    )
    carrying = []
    for file, task in _all_tasks():
        body = {k: v for k, v in task.items() if k not in ("when", "no_log", "block", "rescue")}
        expressions = re.findall(r"\{\{.*?\}\}", json.dumps(body))
        if any(secret_vars.search(e) for e in expressions):
            carrying.append(task["name"])
            assert task.get("no_log") is True or "_vllm_lmcache_api_key" in str(
                task.get("no_log")
            ), f"{file}: {task['name']}"
    assert "present | Write the secret environment file" in carrying
    assert "wait_healthy | Check that the served model is listed" in carrying


def _extra_args_rule() -> dict[str, Any]:
    [task] = [
        t for f, t in _all_tasks() if t["name"] == "validate | Check the cross-field settings"
    ]
    [rule] = [c for c in task["vars"]["_vllm_lmcache_checks"] if "--api-key" in c["msg"]]
    return dict(rule)


@pytest.mark.parametrize(
    ("extra_args", "ok"),
    [
        (["--api-key", "sk-x"], False),
        (["--api-key=sk-x"], False),
        (["--hf-token", "hf_x"], False),
        (["--enable-prefix-caching", "--max-num-seqs", "64"], True),
        (["--api-key-file-is-not-an-option"], True),
        ([], True),
    ],
)
def test_a_secret_in_the_extra_args_is_refused(extra_args: list[str], ok: bool) -> None:
    rule = _extra_args_rule()
    assert _render(rule["ok"], **MODEL, vllm_lmcache_extra_args=extra_args) is ok
    assert "vllm_lmcache_secret_env" in rule["msg"]
