"""`kvops lab demo` (`make lab`): the plan of commands is the documented procedure, in order,
with the lab's variable files, and a non-root user gets one line saying why it cannot run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.lab import demo
from kvops.lab.demo import DemoPaths, demo_steps, service_ids, wheelhouse_vars

ROOT = Path(__file__).resolve().parents[2]


def _steps() -> list[demo.Step]:
    paths = DemoPaths(ROOT, Path("/lab/hosts.yml"), Path("/runs/demo"))
    wheel = wheelhouse_vars("http://10.200.0.1:8080", "10.200.0.1", "pip-25.0-py3-none-any.whl")
    return demo_steps(paths, Path("/venv/bin"), wheel, (990, 991))


def test_the_demo_runs_the_procedure_in_order_with_the_lab_files() -> None:
    steps = _steps()
    assert [s.argv[0].rsplit("/", 1)[-1] for s in steps] == [
        "ansible", "ansible", "ansible-playbook", "ansible-playbook", "kvops", "kvops", "kvops",
    ]  # fmt: skip
    assert steps[0].argv[-1] == "name=vllm gid=991 system=true"
    assert "uid=990 group=vllm" in steps[1].argv[-1]
    site, deploy = steps[2].argv, steps[3].argv
    assert str(ROOT / "playbooks" / "site.yml") in site
    assert str(ROOT / "playbooks" / "deploy.yml") in deploy
    for argv in (site, deploy, steps[6].argv):
        sources = [argv[i + 1] for i, a in enumerate(argv) if a == "-i"]
        assert sources == [
            "/lab/hosts.yml",
            str(ROOT / "tests/lab/site_lab_vars.yml"),
            str(ROOT / "tests/lab/deploy_lab_vars.yml"),
        ]
    extra = json.loads(deploy[deploy.index("-e") + 1])
    assert extra["vllm_lmcache_pip_env"]["PIP_NO_INDEX"] == "1"
    assert steps[4].argv[1] == "validate"
    assert steps[5].argv[1:4] == ["smoke", "--host", "kvlab-1"]
    ab = steps[6].argv
    assert ab[1:5] == ["ab-test", "--deploy", "--limit", "kvlab-1"]
    assert ab[ab.index("--scenario") + 1] == "multi-shared-prefix"
    assert ab[ab.index("--out") + 1] == "/runs/demo"
    engine = [a for a in ab if a.startswith("vllm_lmcache_extra_args=")]
    assert json.loads(engine[0].split("=", 1)[1]) == demo.AB_ENGINE_ARGS


def test_service_ids_come_from_the_lab_deploy_vars() -> None:
    assert service_ids(ROOT / "tests/lab/deploy_lab_vars.yml") == (990, 990)


def test_lab_demo_says_it_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(main, ["lab", "demo"])
    assert result.exit_code == 2
    assert "kvops lab demo needs root" in result.output and "sudo make lab" in result.output
    assert "Traceback" not in result.output
