"""Lab fixtures: disposable Debian hosts for the lab tier (see tests/lab/README.md).

``lab``          session: 3 hosts (kvlab-1..3) shared by the roles' lab tests.
``lab_factory``  session: start more, private labs (own slot, own hosts); all torn down at end.
``operator_collection``  session: the kvops.gds collection installed as an operator would
                 (tests/installed_collection.py), with the operator's own ansible.cfg.
``installed_site_second_run``  session: its site playbook on the shared lab right after the
                 converge: the second run (one run, two tests read it).
``deploy_lab``   session: the two-host A/B lab (an offload and a baseline host) that
                 test_deploy.py, test_deploy_collection.py and last test_shared_store_lab.py
                 (both hosts as offload hosts on one shared store) deploy to; ``wheel_vars``
                 serves it the kvops wheel and ``deployed`` converges it once (site.yml and
                 deploy.yml).

Without root / network namespaces / unshare the lab tier skips with the reason; in CI
(tests/ci_rule.py) it fails instead, because CI must run it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from ci_rule import unavailable
from deploy_lab import PRUNE, offload_and_baseline_lab, served_wheelhouse, site_then_deploy
from installed_collection import BIN, OPERATOR_CONFIG, REPO, Installed, install_collection
from lab_harness import LabHosts, LabSession
from site_lab import SITE_VARS, converge_hosts, converged

from kvops.lab.lab import missing_prerequisites

LAB_HOSTS = int(os.environ.get("KVOPS_LAB_HOSTS", "3"))


def _require_lab() -> None:
    reasons = missing_prerequisites()
    if not reasons:
        return
    message = (
        "local lab unavailable: "
        + "; ".join(reasons)
        + " (as root, `scripts/system-deps.sh` installs the packages the lab needs)"
    )
    unavailable(message)


@pytest.fixture(scope="session")
def lab_factory() -> Iterator[Callable[..., LabHosts]]:
    """``lab_factory(hosts=2, variants={...}, host_vars={...})`` -> a fresh private lab."""
    _require_lab()
    sessions: list[LabSession] = []  # torn down on SIGTERM too (tests/stop_on_sigterm.py)

    def make(**kwargs: Any) -> LabHosts:
        session = LabSession()
        sessions.append(session)
        return session.start(**kwargs)

    try:
        yield make
    finally:
        errors = []
        for session in reversed(sessions):
            try:
                session.close()
            except Exception as exc:  # keep tearing the others down
                errors.append(str(exc))
        if errors:
            pytest.fail("lab teardown: " + "; ".join(errors), pytrace=False)


@pytest.fixture(scope="session")
def lab(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    """The shared lab: ``KVOPS_LAB_HOSTS`` (default 3) healthy hosts kvlab-1..N."""
    return lab_factory(hosts=LAB_HOSTS)


@pytest.fixture(scope="session")
def lab_hosts(lab: LabHosts) -> LabHosts:
    """Alias of ``lab``."""
    return lab


@pytest.fixture(scope="session")
def operator_collection(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The collection built from this checkout and installed into an empty collections path,
    with the operator's own ansible.cfg in a folder outside the checkout."""
    return install_collection(tmp_path_factory.mktemp("operator"), OPERATOR_CONFIG)


@pytest.fixture(scope="session")
def installed_site_second_run(
    lab: LabHosts, operator_collection: Installed
) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook kvops.gds.site` from the installed collection, run from the operator's
    folder on the two site hosts right after the shared lab's converge (by the checkout's
    site.yml). One run proves two things, each read by its own test: a second run changes
    nothing (test_site_converge.py: the collection's roles are the checkout's files), and the
    installed collection converges the lab with the operator's configuration
    (test_site_collection.py)."""
    converged(lab)
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"), "-i", str(lab.inventory_path), "-i", str(SITE_VARS),
            "kvops.gds.site", "--limit", ",".join(converge_hosts(lab)),
        ],
        cwd=operator_collection.user_dir,
        env=operator_collection.env(lab.env({"PYTHONPATH": str(REPO)})),
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="session")
def deploy_lab(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    """The A/B lab, converged once for three modules (each converge is the most of their time),
    in file order, all in the lab-own group: test_deploy.py leaves it deployed as it found it,
    test_deploy_collection.py rolls changes out on it, test_shared_store_lab.py (last: it leaves
    both hosts offload hosts on one shared store) deploys both as a fleet."""
    return offload_and_baseline_lab(lab_factory, **PRUNE)


@pytest.fixture(scope="session")
def wheel_vars(
    deploy_lab: LabHosts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The kvops wheel served on the A/B lab's bridge for the role's pip task (modules with a
    lab of their own define their own)."""
    with served_wheelhouse(deploy_lab, tmp_path_factory.mktemp("wheelhouse")) as extra:
        yield extra


@pytest.fixture(scope="session")
def deployed(deploy_lab: LabHosts, wheel_vars: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return site_then_deploy(deploy_lab, wheel_vars)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``own_lab`` runs in a lab session of its own beside the shared lab's
    (tests/tiers.py): asking for the shared lab there would bring up and converge a second one."""
    shared = {"lab", "lab_hosts"}
    wrong = [
        item.nodeid
        for item in items
        if item.get_closest_marker("own_lab") and shared & set(getattr(item, "fixturenames", ()))
    ]
    if wrong:
        raise pytest.UsageError(
            "marked own_lab but using the shared lab fixture: " + ", ".join(wrong)
        )
