"""The kvops.gds collection as a user gets it: built with `ansible-galaxy collection build` from
this repository's own roles/ and playbooks/, installed into an empty collections path, used from
a directory outside the checkout with the user's own ansible.cfg.

What a user relies on: the tarball holds the roles, playbooks and plugins, and of the Python
package only the files the collection's links point at (galaxy keeps a link whose target is
inside the collection as a link: https://docs.ansible.com/ansible/latest/dev_guide/
developing_collections_distributing.html); the playbooks run by FQCN and find their roles;
`ansible-doc` shows each role's argument spec and the probe module's documentation; the roles'
filters work by FQCN; the probe module returns the evidence the direct probe prints, on the
oldest Python the probe supports.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

import pytest
import yaml
from installed_collection import BIN, REPO, Installed, install_collection
from old_pythons import oldest_supported_python

from kvops.probe.bundle import SHIPPED

# Runs in the lab-own group's process (tests/tiers.py): no timing verdict.
pytestmark = pytest.mark.beside_lab_own

ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())
PLAYBOOKS = sorted(p.stem for p in (REPO / "playbooks").glob("*.yml"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    # The user's own configuration: their collections path only (the dependencies,
    # ansible.posix and friends, come from the `ansible` package as for any user of it).
    return install_collection(tmp_path_factory.mktemp("collection"))


def _members(tarball: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tarball) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_tarball_holds_the_collection_and_only_what_its_links_need(installed: Installed) -> None:
    members = _members(installed.tarball)
    top = {PurePosixPath(name).parts[0] for name in members}
    assert top == {
        "MANIFEST.json", "FILES.json", "README.md", "requirements.yml", "meta", "playbooks",
        "roles", "plugins", "changelogs", "kvops",
    }, top  # fmt: skip
    for role in ROLES:
        assert f"roles/{role}/meta/argument_specs.yml" in members, role
    assert (
        sorted(
            PurePosixPath(n).stem
            for n in members
            if n.startswith("playbooks/") and n.endswith(".yml")
        )
        == PLAYBOOKS
    )
    # every link resolves inside the tarball, and kvops/ holds exactly the links' targets
    targets = set()
    for name, info in members.items():
        if info.issym():
            target = os.path.normpath(str(PurePosixPath(name).parent / info.linkname))
            assert target in members and members[target].isfile(), (name, info.linkname)
            targets.add(target)
    kvops_files = {n for n, i in members.items() if n.startswith("kvops/") and i.isfile()}
    assert kvops_files == {t for t in targets if t.startswith("kvops/")}
    assert {f"plugins/module_utils/probe/{m}.py" for m in SHIPPED} == {
        n for n in members if n.startswith("plugins/module_utils/probe/") and n.endswith(".py")
    }
    role_filters = {p.name for p in (REPO / "roles").glob("*/filter_plugins/*.py")}
    assert {PurePosixPath(n).name for n in members if n.startswith("plugins/filter/")} == (
        role_filters
    )
    assert "plugins/modules/kvops_probe.py" in members


def test_galaxy_dependencies_are_requirements_yml() -> None:
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    requirements = yaml.safe_load((REPO / "requirements.yml").read_text())
    assert galaxy["dependencies"] == {c["name"]: c["version"] for c in requirements["collections"]}
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"].startswith(">=")


def test_ansible_doc_shows_every_roles_argument_spec(installed: Installed) -> None:
    proc = installed.run(
        str(BIN / "ansible-doc"), "-t", "role", "--json", *(f"kvops.gds.{r}" for r in ROLES)
    )
    docs = json.loads(proc.stdout)
    assert sorted(docs) == [f"kvops.gds.{r}" for r in ROLES]
    for role in ROLES:
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
        want = spec["argument_specs"]["main"]["options"]
        shown = docs[f"kvops.gds.{role}"]["entry_points"]["main"]["options"]
        assert sorted(shown) == sorted(want), role
        assert str(installed.collections) in docs[f"kvops.gds.{role}"]["path"]


def test_ansible_doc_shows_the_probe_module(installed: Installed) -> None:
    proc = installed.run(str(BIN / "ansible-doc"), "--json", "kvops.gds.kvops_probe")
    doc = json.loads(proc.stdout)["kvops.gds.kvops_probe"]["doc"]
    assert set(doc["options"]) == {"config", "host", "probe_version", "http_bearer_token"}
    assert doc["attributes"]["check_mode"]["support"] == "full"


def test_playbooks_run_by_fqcn_from_a_users_playbook(installed: Installed) -> None:
    (installed.user_dir / "hosts.ini").write_text(
        "[gpu_hosts]\ngpu-1 ansible_host=192.0.2.1\n[ontap]\ncluster-1 ansible_connection=local\n"
    )
    (installed.user_dir / "mine.yml").write_text(
        "---\n"
        + "".join(
            f"- name: Mine | {p}\n  ansible.builtin.import_playbook: kvops.gds.{p}\n"
            for p in PLAYBOOKS
        )
    )
    proc = installed.run(
        str(BIN / "ansible-playbook"), "-i", "hosts.ini", "mine.yml", "--list-tasks"
    )
    for role in ROLES:
        assert f"kvops.gds.{role} : " in proc.stdout, role
    assert "Kvops | Probe the host" in proc.stdout
    assert str(REPO) not in proc.stdout + proc.stderr
    # and directly by name
    proc = installed.run(
        str(BIN / "ansible-playbook"), "-i", "hosts.ini", "kvops.gds.deploy", "--syntax-check"
    )
    assert str(installed.collections) in proc.stdout


def test_the_roles_filters_work_by_fqcn(installed: Installed) -> None:
    proc = installed.run(
        str(BIN / "ansible"), "localhost", "-m", "ansible.builtin.debug", "-a",
        json.dumps({
            "msg": "{{ {'properties': {'io_batchsize': '64'}} "
            "| kvops.gds.cufile_typed({'properties.io_batchsize': 'int'}) }}"
        }),
    )  # fmt: skip
    assert '"io_batchsize": 64' in proc.stdout, proc.stdout


def _evidence_shape(document: dict[str, object]) -> dict[str, tuple[object, object]]:
    items = document["items"]
    assert isinstance(items, dict)
    return {k: (v.get("kind"), v.get("source")) for k, v in items.items()}


def test_probe_module_returns_the_direct_probes_evidence(installed: Installed) -> None:
    """On the oldest Python the probe supports, through Ansible's local connection: the same
    items (kind, source) as `python -m kvops.probe` with the same config; changed false; check
    mode runs without the storage bench and says so."""
    python, version = oldest_supported_python()
    config = {"settings": {"role": "none", "storage_bench": False}, "deadline_s": 60}
    (installed.user_dir / "local.ini").write_text(
        f"probe-host ansible_connection=local ansible_python_interpreter={python}\n"
    )
    token = "s3cret-token-for-the-test"
    args = {"host": "probe-host", "config": config, "probe_version": "test"}
    proc = installed.run(
        str(BIN / "ansible"), "-i", "local.ini", "probe-host", "-m", "kvops.gds.kvops_probe",
        "-a", json.dumps({**args, "http_bearer_token": token}), "-o", "-vvv",
    )  # fmt: skip
    assert token not in proc.stdout + proc.stderr  # no_log: not even in the invocation
    assert "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER" in proc.stdout
    result = json.loads(proc.stdout.split("=>", 1)[1].strip().splitlines()[0])
    assert result["changed"] is False
    via_module = result["evidence"]
    assert via_module["host"] == "probe-host" and via_module["probe_version"] == "test"
    assert via_module["settings"] == config["settings"]
    direct = subprocess.run(
        [str(python), "-m", "kvops.probe", json.dumps({**config, "host": "probe-host"})],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert _evidence_shape(via_module) == _evidence_shape(json.loads(direct.stdout)), version

    checked = {
        "host": "probe-host",
        "config": {"settings": {"role": "none", "storage_bench": True}},
    }
    proc = installed.run(
        str(BIN / "ansible"), "-i", "local.ini", "probe-host", "-m", "kvops.gds.kvops_probe",
        "-a", json.dumps(checked), "-o", "--check",
    )  # fmt: skip
    result = json.loads(proc.stdout.split("=>", 1)[1])
    assert result["changed"] is False
    assert result["check_mode_skipped"] == ["storage_bench"]
    assert result["evidence"]["settings"]["storage_bench"] is False
