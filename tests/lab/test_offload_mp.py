"""The vllm_lmcache role's offload_mp variant (LMCache's multiprocess server) on a lab host:
its default settings pass the role's own checks in a real play (the role's filter plugins and
flag list loaded by Ansible, as on a production host), and a server flag the pinned
`lmcache server` does not take, an adapter type it does not register, a GDS L1 slab on the
shared export or a transfer mode that is not one of its choices fail the play before anything
changes, with a message that names the problem.

The converge of offload_mp itself (two units, vLLM registered with the server, a hit from the
file tier after a restart) runs in the engine tier on the real LMCache
(tests/engine/test_lmcache_mp_engine.py): the lab's engine stand-in, `kvops sim serve`, has no
LMCache server to register with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lab_harness import LabHosts
from site_lab import REPO_ROOT, SITE_VARS, explain, failure_messages, recap, run_role

pytestmark = pytest.mark.lab

MP = {
    "vllm_lmcache_variant": "offload_mp",
    "vllm_lmcache_model": "llama-3.1-8b",
    "vllm_lmcache_gds_dir": "/mnt/kvcache/gds",
}


@pytest.fixture(scope="module")
def mp_lab(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    return lab_factory(hosts=1, name_prefix="kvmp")


def test_the_default_offload_mp_settings_pass_the_roles_checks(
    mp_lab: LabHosts, tmp_path: Path
) -> None:
    name = mp_lab.names[0]
    playbook = tmp_path / "validate-offload-mp.yml"
    playbook.write_text(
        "---\n- name: Check the offload_mp settings as the role does before any change\n"
        "  hosts: gpu_hosts\n  gather_facts: false\n  tasks:\n"
        "    - name: Validate the role's arguments and run its checks\n"
        "      ansible.builtin.include_role:\n        name: vllm_lmcache\n"
        "        tasks_from: validate\n"
    )
    proc = mp_lab.ansible_playbook(
        playbook,
        "-i",
        str(SITE_VARS),
        limit=name,
        extra_vars=MP,
        env={"ANSIBLE_ROLES_PATH": str(REPO_ROOT / "roles")},
    )
    assert proc.returncode == 0, explain(proc)
    assert "Check the lmcache server flags against LMCache 0.5.6" in proc.stdout, explain(proc)
    assert recap(proc)[name]["changed"] == 0


CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown-flag",
        {"vllm_lmcache_mp_extra_args": ["--l1-size-gib", "4"]},
        '"--l1-size-gib" is not a flag of lmcache server 0.5.6 (did you mean "--l1-size-gb"?)',
    ),
    (
        "unknown-adapter",
        {"vllm_lmcache_mp_l2_adapters": [{"type": "nixl", "base_path": "/mnt/kvcache/gds"}]},
        'L2 adapter 0 has type "nixl", not one of LMCache\'s',
    ),
    (
        "gds-l1-on-the-export",
        {"vllm_lmcache_mp_gds_l1_path": "/mnt/kvcache/gds/slab"},
        "vllm_lmcache_mp_gds_l1_path must be an absolute directory on local NVMe",
    ),
    (
        "transfer-mode-choice",
        {"vllm_lmcache_mp_transfer_mode": "lmcache-driven"},
        "vllm_lmcache_mp_transfer_mode must be one of: auto, engine_driven, lmcache_driven",
    ),
]


@pytest.mark.parametrize(
    ("extra_vars", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_setting_the_server_would_refuse_fails_before_anything_changes(
    mp_lab: LabHosts, tmp_path: Path, extra_vars: dict[str, Any], expected: str
) -> None:
    name = mp_lab.names[0]
    proc = run_role(mp_lab, tmp_path, "vllm_lmcache", limit=name, extra_vars={**MP, **extra_vars})
    assert proc.returncode != 0, explain(proc)
    fatal = failure_messages(proc)
    assert expected in fatal, f"{expected!r} not in:\n{fatal}\n{explain(proc)}"
    assert recap(proc)[name]["changed"] == 0
