"""How kvops runs its Ansible content: the checkout as the kvops.gds collection, or the installed
collection with the user's own configuration (kvops.remote.collection, kvops.abtest.deploy,
kvops.validate.via_ansible's event reading)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvops.abtest.deploy import DeploySettings, deploy_record, settings_from_record
from kvops.cli.ab_test import _deploy_settings
from kvops.remote.collection import checkout_root, collection_env, playbook
from kvops.validate.collect import HostStatus
from kvops.validate.via_ansible import PROBE_TASK, _Watch

REPO = Path(__file__).resolve().parents[2]


def _args(**kw: Any) -> Any:
    base = {"deploy": True, "inventories": (), "limit": "gpu1", "deploy_vars": ()}
    return SimpleNamespace(**{**base, **kw})


def test_outside_a_checkout_deploy_runs_the_installed_collection_with_the_users_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = _deploy_settings(_args())
    assert settings is not None and settings.project_root is None
    kwargs = settings.runner_kwargs()
    # no ANSIBLE_CONFIG override, no inventory: what Ansible finds from here decides
    assert kwargs == {"playbook": "kvops.gds.deploy", "project_dir": str(tmp_path)}
    # run.json round trip (--resume) keeps "installed collection"
    assert settings_from_record(deploy_record(settings), {}).project_root is None


def test_inside_the_checkout_deploy_runs_the_checkouts_playbook_and_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO / "tests")
    settings = _deploy_settings(_args(inventories=("inv.yml",)))
    assert settings is not None and settings.project_root == REPO
    kwargs = settings.runner_kwargs()
    assert kwargs["playbook"] == str(REPO / "playbooks" / "deploy.yml")
    assert kwargs["envvars"] == {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    assert kwargs["inventory"] == ["inv.yml"]
    assert settings_from_record(deploy_record(settings), {}).project_root == REPO


def test_deploy_needs_only_the_host() -> None:
    with pytest.raises(ValueError, match="needs the host"):
        _deploy_settings(_args(limit=None))
    assert isinstance(_deploy_settings(_args()), DeploySettings)


def test_the_checkout_is_put_on_the_collections_path_ahead_of_the_users(
    tmp_path: Path,
) -> None:
    assert checkout_root(REPO / "kvops" / "probe") == REPO
    assert checkout_root(tmp_path) is None
    with collection_env(None) as env:
        assert env == {}
    with collection_env(REPO, {"ANSIBLE_COLLECTIONS_PATH": "/mine"}) as env:
        first, rest = env["ANSIBLE_COLLECTIONS_PATH"].split(":", 1)
        assert rest == "/mine"
        link = Path(first) / "ansible_collections" / "kvops" / "gds"
        assert link.resolve() == REPO
        assert (link / "playbooks" / "validate.yml").is_file()
    assert not Path(first).exists()  # removed on exit
    with collection_env(REPO, {}) as env:
        assert env["ANSIBLE_COLLECTIONS_PATH"].endswith(
            ":~/.ansible/collections:/usr/share/ansible/collections"
        )
    assert playbook("site") == "kvops.gds.site"


def _event(kind: str, host: str, res: dict[str, Any], task: str = PROBE_TASK) -> dict[str, Any]:
    return {"event": kind, "event_data": {"task": task, "host": host, "res": res}}


def test_the_probe_tasks_events_become_one_outcome_per_host() -> None:
    seen: list[str] = []
    watch = _Watch(on_result=seen.append)
    doc = {"host": "liar", "items": {}}
    watch(_event("runner_on_start", "a", {}))
    watch(_event("runner_on_ok", "a", {"evidence": doc}))
    watch(_event("runner_on_ok", "a", {"evidence": "other task"}, task="Kvops | Write"))
    watch(_event("runner_on_unreachable", "b", {"unreachable": True, "msg": "ssh: refused"}))
    # ignore_unreachable: the play goes on, the event is still the probe task's result
    watch(_event("runner_on_ok", "c", {"unreachable": True, "msg": "timed out"}))
    watch(_event("runner_on_failed", "d", {"msg": "kvops probe failed on the host: X"}))
    assert watch.results["a"] == (HostStatus.OK, doc, "")
    assert watch.results["b"] == (HostStatus.UNREACHABLE, None, "ssh: refused")
    assert watch.results["c"] == (HostStatus.UNREACHABLE, None, "timed out")
    assert watch.results["d"][:2] == (HostStatus.PROBE_FAILED, None)
    assert seen == ["a", "b", "c", "d"]
    assert "a" in watch.durations and "b" not in watch.durations


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from-evidence", ".", "--via", "ansible"], "drop --via"),
        (["-i", "h,", "--via", "ansible", "--accept-new-host-keys"], "Ansible's own host key"),
        (["-i", "h,", "--via", "rsh"], "'rsh' is not one of"),
    ],
)
def test_via_ansible_usage_errors(args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from kvops.cli import main

    result = CliRunner().invoke(main, ["validate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_forks_default_to_ansible_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvops.cli.validate import _env_forks

    monkeypatch.setenv("ANSIBLE_FORKS", "40")
    assert _env_forks() == 40
    monkeypatch.setenv("ANSIBLE_FORKS", "0")
    assert _env_forks() == 16
    monkeypatch.delenv("ANSIBLE_FORKS")
    assert _env_forks() == 16


def test_an_evidence_document_past_the_direct_paths_bound_is_a_failed_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kvops.validate.via_ansible.MAX_OUTPUT", 1000)
    watch = _Watch()
    watch(_event("runner_on_ok", "big", {"evidence": {"items": {"x": "y" * 2000}}}))
    status, doc, why = watch.results["big"]
    assert (status, doc) == (HostStatus.PROBE_FAILED, None) and "exceeds 1000 bytes" in why
