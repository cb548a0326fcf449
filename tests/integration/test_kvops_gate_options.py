"""The rollout gate's options are checked by Ansible's own argument spec before anything is
probed: a value that is no boolean fails the task naming the option (a plain truthiness test
would read `fail_on_finding: "False"` or a typo as true and fail a rollout for the wrong reason).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _play(tmp_path: Path, options: str) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "gate.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - kvops.gds.kvops_gate:\n{options}"
    )
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    return subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("        fail_on_finding: maybe\n", "'maybe' is not a valid boolean"),
        ("        storage_bench: sometimes\n", "'sometimes' is not a valid boolean"),
        ("        fail_on_findings: false\n", "fail_on_findings"),
    ],
)
def test_a_bad_gate_option_fails_the_task_naming_it(
    tmp_path: Path, options: str, message: str
) -> None:
    proc = _play(tmp_path, options)
    assert proc.returncode != 0
    fatal = next(line for line in proc.stdout.splitlines() if line.startswith("fatal:"))
    assert message in fatal, proc.stdout[-2000:]
