"""The vllm_lmcache role's offload_mp variant (LMCache's multiprocess server): the server's
command line the role renders, its flags checked against the pinned `lmcache server --help`
(files/lmcache_server_flags.json), the connector vLLM gets, the two units' dependency, and the
settings the role refuses before it changes anything.

Rendered with Ansible's own templar from the role's defaults and vars, as a play would.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template
from role_files import role_vars_file

ROLE = Path(__file__).resolve().parents[2] / "roles" / "vllm_lmcache"
FLAG_DOC: dict[str, Any] = json.loads((ROLE / "files" / "lmcache_server_flags.json").read_text())
MODEL = {
    "vllm_lmcache_model": "meta-llama/Llama-3.1-8B-Instruct",
    "vllm_lmcache_variant": "offload_mp",
}

pytestmark = pytest.mark.unit

DIGEST = "docker.io/lmcache/vllm-openai@sha256:" + "0" * 64


def _filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lmcache_server_flags", ROLE / "filter_plugins" / "lmcache_server_flags.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FILTERS = _filters()


def _templar(**role_vars: Any) -> Templar:
    variables: dict[str, Any] = {}
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
        variables.update(role_vars_file(path))
    variables.update(MODEL)
    # what the role's lookup('file', 'lmcache_server_flags.json') reads inside a play
    variables["_vllm_lmcache_server_flag_doc"] = FLAG_DOC
    variables.update(role_vars, ansible_facts={"os_family": "Debian"}, ansible_managed="managed")
    # the role calls its filters by FQCN (kvops.gds.*): resolve the collection as a play run
    # from the checkout does (ansible.cfg's collections_path starts with .collections)
    init_plugin_loader([str(ROLE.parents[1] / ".collections")])
    return Templar(loader=DataLoader(), variables=variables)


def _render(expr: str, **role_vars: Any) -> Any:
    return _templar(**role_vars).template(trust_as_template(expr))


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _validate_failures(**role_vars: Any) -> list[str]:
    """The messages of the role's offload_mp assertions (tasks/validate.yml) for these vars."""
    tasks = yaml.safe_load((ROLE / "tasks" / "validate.yml").read_text())
    messages: list[str] = []
    for task in tasks:
        if task.get("when") != "_vllm_lmcache_mp":
            continue
        templar = _templar(**role_vars)
        if "_vllm_lmcache_mp_checks" in task["vars"]:
            checks = [
                (
                    templar.template(trust_as_template(c["ok"])),
                    str(templar.template(trust_as_template(c["msg"]))),
                )
                for c in task["vars"]["_vllm_lmcache_mp_checks"]
            ]
            messages += [msg for ok, msg in checks if ok is not True]
        else:
            problems = task["vars"]["_vllm_lmcache_mp_problems"]
            messages += list(templar.template(trust_as_template(problems)))
    return messages


def test_the_server_runs_with_l1_in_dram_and_the_gds_dir_as_its_file_tier() -> None:
    argv = shlex.split(_render("{{ _vllm_lmcache_mp_exec_start }}"))
    assert argv[:2] == ["/opt/kvops/vllm-venv/bin/lmcache", "server"]
    assert _option(argv, "--supported-transfer-mode") == "auto"
    assert _option(argv, "--l1-size-gb") == "20.0"
    assert _option(argv, "--eviction-policy") == "LRU"
    assert _option(argv, "--chunk-size") == "256"
    assert _option(argv, "--http-host") == "127.0.0.1"
    assert json.loads(_option(argv, "--l2-adapter")) == {
        "type": "fs",
        "base_path": "/mnt/kvcache/gds",
    }
    assert "--gds-l1-path" not in argv
    assert FILTERS.lmcache_server_flag_problems(argv[2:], FLAG_DOC, "0.5.6", []) == []
    assert _validate_failures() == []


def test_vllm_connects_through_lmcaches_mp_connector_without_an_lmcache_yaml() -> None:
    argv = shlex.split(_render("{{ _vllm_lmcache_exec_start }}"))
    assert json.loads(_option(argv, "--kv-transfer-config")) == {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": 5555,
        },
    }
    env = _render("{{ _vllm_lmcache_environment }}")
    assert "LMCACHE_CONFIG_FILE" not in env
    assert _render("{{ _vllm_lmcache_offload }}") is False
    server_env = _render("{{ _vllm_lmcache_mp_environment }}")
    assert server_env["LMCACHE_TRACK_USAGE"] == "false"


def test_the_vllm_unit_requires_the_server_only_in_offload_mp() -> None:
    text = (ROLE / "templates" / "vllm.service.j2").read_text()
    unit = str(_render(text))
    assert "Requires=lmcache.service" in unit and "After=lmcache.service" in unit
    other = str(_render(text, vllm_lmcache_variant="offload"))
    assert "lmcache.service" not in other
    server = str(_render((ROLE / "templates" / "lmcache_server.service.j2").read_text()))
    assert (
        "ExecStart=/opt/kvops/vllm-venv/bin/lmcache server --host 127.0.0.1 --port 5555" in server
    )
    assert "RequiresMountsFor=/mnt/kvcache/gds" in server


def test_a_gds_l1_slab_and_nixl_store_render_as_flags() -> None:
    adapters = [
        {
            "type": "nixl_store",
            "backend": "GDS",
            "pool_size": 64,
            "backend_params": {"file_path": "/mnt/kvcache/gds/mp", "use_direct_io": "true"},
        }
    ]
    role_vars = {
        "vllm_lmcache_mp_gds_l1_path": "/nvme/lmcache",
        "vllm_lmcache_mp_l2_adapters": adapters,
    }
    argv = shlex.split(_render("{{ _vllm_lmcache_mp_exec_start }}", **role_vars))
    assert _option(argv, "--gds-l1-path") == "/nvme/lmcache"
    assert json.loads(_option(argv, "--l2-adapter")) == adapters[0]
    assert _validate_failures(**role_vars) == []


@pytest.mark.parametrize(
    ("extra_args", "problem"),
    [
        (
            ["--l1-size-gib", "4"],
            '"--l1-size-gib" is not a flag of lmcache server 0.5.6 (did you mean "--l1-size-gb"?)',
        ),
        (["--max-workers"], '"--max-workers" needs a value'),
        (
            ["--disable-metrics=yes"],
            '"--disable-metrics" takes no value (got "--disable-metrics=yes")',
        ),
        (["stray"], '"stray" is not a flag and no flag before it takes a value'),
    ],
)
def test_a_flag_lmcache_server_does_not_take_is_refused(
    extra_args: list[str], problem: str
) -> None:
    assert _validate_failures(vllm_lmcache_mp_extra_args=extra_args) == [problem]


def test_known_flags_and_vouched_for_flags_pass() -> None:
    args = [
        "--max-workers",
        "4",
        "--enable",
        "transfer_query",
        "--no-l1-use-lazy",
        "--port=6000",
        "-q",
    ]
    assert FILTERS.lmcache_server_flag_problems(args, FLAG_DOC, "0.5.6", []) == []
    assert (
        FILTERS.lmcache_server_flag_problems(["--new-flag", "1"], FLAG_DOC, "0.5.7", ["--new-flag"])
        == []
    )
    # before the version the flags were checked against the role vouches for none
    assert FILTERS.lmcache_server_flag_problems(["--port", "1"], FLAG_DOC, "0.5.5", []) == [
        '"--port" is not a flag of lmcache server 0.5.5'
    ]


@pytest.mark.parametrize(
    ("role_vars", "needle"),
    [
        (
            {"vllm_lmcache_mp_l2_adapters": [{"type": "fss", "base_path": "/mnt/kvcache/gds"}]},
            'did you mean "fs"',
        ),
        (
            {"vllm_lmcache_mp_l2_adapters": [{"type": "fs", "base_path": "/var/tmp/kv"}]},
            "must be the shared GDS directory",
        ),
        (
            {"vllm_lmcache_mp_gds_l1_path": "/mnt/kvcache/gds/slab"},
            "not on the shared GDS directory",
        ),
        ({"vllm_lmcache_mp_service_name": "vllm"}, "must differ"),
        ({"vllm_lmcache_mp_extra_args": ["--l2-adapter", "{}"]}, "vllm_lmcache_mp_l2_adapters"),
        (
            {
                "vllm_lmcache_install_method": "container",
                "vllm_lmcache_container_image": DIGEST,
                "vllm_lmcache_mp_container_entrypoint": "lmcache",
            },
            "vllm_lmcache_mp_container_entrypoint must be the absolute path",
        ),
        ({"vllm_lmcache_mp_hash_algorithm": "builtin"}, "blake3 or sha256_cbor"),
    ],
)
def test_settings_the_server_would_misuse_are_refused(
    role_vars: dict[str, Any], needle: str
) -> None:
    failures = _validate_failures(**role_vars)
    assert any(needle in f for f in failures), failures


def test_the_flag_list_is_the_pinned_versions() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert FLAG_DOC["since"] == defaults["vllm_lmcache_lmcache_version"]
    assert {"--supported-transfer-mode", "--l2-adapter", "--gds-l1-path"} <= set(FLAG_DOC["flags"])
    assert {"fs", "fs_native", "nixl_store", "fault_inject"} <= set(FLAG_DOC["l2_adapter_types"])


def test_with_the_container_install_method_the_server_is_its_own_container() -> None:
    container = {
        "vllm_lmcache_install_method": "container",
        "vllm_lmcache_container_image": DIGEST,
        "vllm_lmcache_mp_gds_l1_path": "/local/nvme/lmcache/slab",
    }
    argv = shlex.split(_render("{{ _vllm_lmcache_mp_exec_start }}", **container))
    assert argv[:6] == ["podman", "run", "--rm", "--name", "lmcache", "--ipc=host"]
    assert "--network=host" in argv
    # the image's own lmcache, beside its vllm
    assert argv[argv.index("--entrypoint") + 1 :][:3] == ["/opt/venv/bin/lmcache", DIGEST, "server"]
    # every directory the server writes, at the same path as on the host
    volumes = {a.split("=", 1)[1] for a in argv if a.startswith("--volume=")}
    assert {
        "/mnt/kvcache/gds:/mnt/kvcache/gds",
        "/local/nvme/lmcache:/local/nvme/lmcache",
    } <= volumes
    assert "--device" in argv  # the GPUs (CDI) for the transfer mode's CUDA IPC
    flags = argv[argv.index("server") + 1 :]
    assert FILTERS.lmcache_server_flag_problems(flags, FLAG_DOC, "0.5.6", []) == []
    assert _validate_failures(**container) == []
    unit = str(_render((ROLE / "templates" / "lmcache_server.service.j2").read_text(), **container))
    assert "User=root" in unit  # the runtime runs as root; the server inside as the service user
    assert "ExecStartPre=-/usr/bin/podman rm --force lmcache" in unit
    virtualenv = str(_render((ROLE / "templates" / "lmcache_server.service.j2").read_text()))
    assert "podman" not in virtualenv and "User=root" not in virtualenv
