"""The RHEL 9 branches of the host roles, checked without a RHEL host.

No RHEL, Rocky, Alma or UBI repository is reachable from the machines these tests run on, so the
lab (Debian) never runs a RedHat task. What can be proved here is proved here: the RedHat task
files load and resolve every module as ansible-playbook reads them (--syntax-check), and their
pure logic — which tasks run on RHEL and which on a rebuild, in which order, with which rendered
package lists — is rendered with Ansible's own templar for RHEL 9 and Rocky 9 facts. What a real
dnf, rpm_key, subscription-manager or DKMS build does with them stays unverified here (README of
each role, "RHEL 9").
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleError
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.playbook import Playbook
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template
from ansible.vars.manager import VariableManager
from role_files import role_vars_file

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"

RHEL_TASK_FILES = [
    ROLES / "nvidia_driver" / "tasks" / "install-RedHat.yml",
    ROLES / "rdma_client" / "tasks" / "install-RedHat.yml",
    ROLES / "nvidia_fs" / "tasks" / "install-RedHat.yml",
    ROLES / "kernel_gate" / "tasks" / "cmdline-RedHat.yml",
]

FACTS = {
    "rhel": {
        "distribution": "RedHat",
        "distribution_version": "9.4",
        "distribution_major_version": "9",
        "os_family": "RedHat",
        "architecture": "x86_64",
        "kernel": "5.14.0-427.13.1.el9_4.x86_64",
    },
    "rocky": {
        "distribution": "Rocky",
        "distribution_version": "9.5",
        "distribution_major_version": "9",
        "os_family": "RedHat",
        "architecture": "x86_64",
        "kernel": "5.14.0-503.14.1.el9_5.x86_64",
    },
}


def _syntax_check(tmp_path: Path, task_files: list[Path]) -> None:
    """What ``ansible-playbook --syntax-check`` does (its PlaybookExecutor loads each playbook
    with ``Playbook.load`` and stops there), in this process: a subprocess would cost a second
    of interpreter start-up per call in the unit tier. Raises AnsibleError as it would report."""
    imports = "".join(
        f"    - name: Import {p.parent.parent.name}/{p.name}\n"
        f"      ansible.builtin.import_tasks: {p}\n"
        for p in task_files
    )
    playbook = tmp_path / "rhel-branches.yml"
    playbook.write_text(
        f"---\n- name: RHEL branches\n  hosts: all\n  gather_facts: false\n  tasks:\n{imports}"
    )
    with warnings.catch_warnings():  # the collection finder may be set up by an earlier test
        warnings.simplefilter("ignore")
        init_plugin_loader()  # as the CLI does: resolves collection (FQCN) module names
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources="localhost,")
    Playbook.load(
        str(playbook),
        variable_manager=VariableManager(loader=loader, inventory=inventory),
        loader=loader,
    )


def test_the_rhel_task_files_pass_ansibles_syntax_check(tmp_path: Path) -> None:
    """Statically imported, so each task and module name is resolved (the roles include these
    files dynamically by OS family, which --syntax-check on site.yml never opens)."""
    _syntax_check(tmp_path, RHEL_TASK_FILES)
    # The same check on a copy with one misspelt module fails: the check can fail.
    broken = tmp_path / "install-RedHat.yml"
    text = RHEL_TASK_FILES[0].read_text()
    assert "community.general.dnf_versionlock:" in text
    broken.write_text(text.replace("dnf_versionlock:", "dnf_versionlok:", 1))
    with pytest.raises(AnsibleError, match=r"couldn't resolve module/action.*dnf_versionlok"):
        _syntax_check(tmp_path, [broken])


def _tasks(role: str, name: str) -> list[dict[str, Any]]:
    tasks = yaml.safe_load((ROLES / role / "tasks" / name).read_text())
    assert isinstance(tasks, list)
    return tasks


def _module(task: dict[str, Any]) -> str:
    [module] = [k for k in task if "." in k and k.split(".")[0] in ("ansible", "community")]
    return module


def _variables(role: str, platform: str, **extra: Any) -> dict[str, Any]:
    facts = FACTS[platform]
    variables: dict[str, Any] = {}
    for path in (ROLES / role / "defaults" / "main.yml", ROLES / role / "vars" / "main.yml"):
        variables.update(role_vars_file(path))
    os_vars = ROLES / role / "vars" / "RedHat.yml"
    if os_vars.is_file():
        variables.update(role_vars_file(os_vars))
    variables.update(extra, ansible_facts=facts, ansible_check_mode=False)
    return variables


def _render(expr: str, variables: dict[str, Any]) -> Any:
    # the roles call their filters by FQCN (kvops.gds.*): the checkout as the collection
    with warnings.catch_warnings():  # the collection finder may be set up by an earlier test
        warnings.simplefilter("ignore")
        init_plugin_loader([str(REPO / ".collections")])
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expr))


def _runs(task: dict[str, Any], variables: dict[str, Any]) -> bool:
    when = task.get("when", [])
    conditions = when if isinstance(when, list) else [when]
    return all(_render("{{ " + str(c) + " }}", variables) for c in conditions)


_DRIVER_RUN = {
    "nvidia_driver_cuda_repo_pending": False,
    "_nvidia_driver_install": {"changed": True},
}


@pytest.mark.parametrize(
    ("platform", "crb_task"),
    [
        ("rhel", "install-RedHat | Enable CodeReady Builder on RHEL (EPEL needs it)"),
        ("rocky", "install-RedHat | Enable CRB on RHEL rebuilds (EPEL needs it)"),
    ],
)
def test_the_driver_install_comes_after_its_build_and_repository_prerequisites(
    platform: str, crb_task: str
) -> None:
    """dkms is in EPEL, which needs CRB: on RHEL 9 the plugins, then CRB (subscription repository
    on RHEL, the crb repository on a rebuild: exactly one of them), EPEL's key and release
    package, NVIDIA's key (pinned) and repository, then the driver with the running kernel's
    kernel-devel and dkms, and only then the versionlock."""
    variables = _variables("nvidia_driver", platform, **_DRIVER_RUN)
    tasks = [t for t in _tasks("nvidia_driver", "install-RedHat.yml") if _runs(t, variables)]
    names = [t["name"] for t in tasks]
    crb_tasks = [n for n in names if "CRB" in n or "CodeReady" in n]
    assert crb_tasks == [crb_task]
    order = [
        "install-RedHat | Install the dnf plugins (versionlock, config-manager)",
        crb_task,
        "install-RedHat | Import EPEL's signing key",
        "install-RedHat | Install EPEL's release package",
        "install-RedHat | Import the CUDA repository's signing key, checked against its "
        "fingerprint",
        "install-RedHat | Configure the CUDA dnf repository",
        "install-RedHat | Install the driver module stream",
        "install-RedHat | Lock the driver packages at the installed version",
    ]
    assert [n for n in names if n in order] == order
    by_name = {t["name"]: t for t in tasks}
    plugins = _render(
        by_name[order[0]]["ansible.builtin.dnf"]["name"], variables
    )  # the versionlock and config-manager plugins before they are used
    assert set(plugins) == {"python3-dnf-plugin-versionlock", "dnf-plugins-core"}
    kernel = FACTS[platform]["kernel"]
    install = _render(by_name[order[6]]["ansible.builtin.dnf"]["name"], variables)
    assert install == [
        f"kernel-devel-{kernel}",
        "dkms",
        "@nvidia-driver:580-open",
        "nvidia-persistenced",
    ]
    # The key is downloaded, checked to be the pinned key ALONE, and those bytes imported (rpm_key's
    # own check only asks that the pin be among the file's keys); the repository names no gpgkey.
    steps = {t["name"]: t for t in by_name[order[4]]["block"]}
    download = steps["install-RedHat | Download the CUDA repository's signing key"]
    assert _render(download["ansible.builtin.get_url"]["url"], variables).endswith(
        "/repos/rhel9/x86_64/D42D0685.pub"
    )
    check = steps["install-RedHat | Refuse a CUDA repository key without the pinned fingerprint"]
    assert "openpgp_only_key" in check["ansible.builtin.assert"]["that"][0]
    key = steps["install-RedHat | Import the checked CUDA repository key"][
        "ansible.builtin.rpm_key"
    ]
    assert _render(key["fingerprint"], variables) == "610C7B14E068A878070DA4E99CD0A493D42D0685"
    assert key["key"] == "{{ _nvidia_driver_key_download.path }}"
    assert "gpgkey" not in by_name[order[5]]["ansible.builtin.yum_repository"]
    locked = _render(by_name[order[7]]["community.general.dnf_versionlock"]["name"], variables)
    assert "kmod-nvidia-open-dkms" in locked and "nvidia-driver" in locked


def test_without_kernel_build_packages_the_rhel_install_asks_for_none() -> None:
    variables = _variables(
        "nvidia_driver", "rhel", nvidia_driver_kernel_build_packages=False, **_DRIVER_RUN
    )
    [install] = [
        t for t in _tasks("nvidia_driver", "install-RedHat.yml")
        if t["name"] == "install-RedHat | Install the driver module stream"
    ]  # fmt: skip
    assert _render(install["ansible.builtin.dnf"]["name"], variables) == [
        "@nvidia-driver:580-open",
        "nvidia-persistenced",
    ]


@pytest.mark.parametrize(
    ("fingerprint", "import_task"),
    [
        (
            "70454E6BF5D9C2D3B78709E8DC726C5E41B9CC50",
            "install-RedHat | Import the DOCA repository's signing key, checked against its "
            "fingerprint",
        ),
        (
            "",
            "install-RedHat | Import the DOCA repository's signing key, NOT pinned (see the "
            "warning above)",
        ),
    ],
)
def test_the_doca_key_is_imported_before_its_repository_and_the_stack(
    fingerprint: str, import_task: str
) -> None:
    """One key import runs (pinned when a fingerprint is set, else unpinned after the role's
    warning), before the repository and the stack install."""
    variables = _variables(
        "rdma_client",
        "rhel",
        rdma_client_doca_repo_key_fingerprint=fingerprint,
        rdma_client_doca_repo_pending=False,
    )
    names = [t["name"] for t in _tasks("rdma_client", "install-RedHat.yml") if _runs(t, variables)]
    assert names == [
        import_task,
        "install-RedHat | Configure the DOCA dnf repository",
        "install-RedHat | Install the RDMA stack",
    ]
    url = _render("{{ rdma_client_doca_repo_url | trim }}", variables)
    assert url == "https://linux.mellanox.com/public/repo/doca/3.1.0/rhel9.4/x86_64/"
    # Pinned: the repository names no gpgkey URL, so dnf can import no key but the checked one.
    [repo] = [
        t for t in _tasks("rdma_client", "install-RedHat.yml")
        if t["name"] == "install-RedHat | Configure the DOCA dnf repository"
    ]  # fmt: skip
    gpgkey = _render(
        repo["ansible.builtin.yum_repository"]["gpgkey"], {**variables, "omit": "OMIT"}
    )
    assert gpgkey == (
        "OMIT"
        if fingerprint
        else "https://linux.mellanox.com/public/repo/doca/GPG-KEY-Mellanox.pub"
    )
