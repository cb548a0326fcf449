"""The kvops.gds collection as a user installs it, for the tests that use it that way.

Not a test module. ``install_collection`` builds the tarball from this checkout with
`ansible-galaxy collection build`, installs it with `ansible-galaxy collection install
--offline --no-deps` into an empty collections path and writes the user's own ``ansible.cfg``
in a folder outside the checkout, naming only that path. Galaxy is not reachable from the test
machines: the four dependency collections (ansible.posix, community.general, ...) come from the
``ansible`` package in the venv, as for any user of that package (Ansible searches the
``ansible_collections`` of its Python path after the configured paths:
https://docs.ansible.com/ansible/latest/reference_appendices/config.html#collections-paths).
Used by tests/integration/test_collection_build.py, tests/lab/conftest.py (the site tests'
operator_collection) and tests/lab/test_shared_store_lab.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# where `ansible-galaxy collection install -p DIR` puts kvops.gds under DIR
INSTALLED_PATH = Path("ansible_collections") / "kvops" / "gds"
# An operator's own ansible.cfg settings (install_collection's `config`): host keys checked,
# pipelining on, as the checkout's ansible.cfg has them.
OPERATOR_CONFIG = (
    "host_key_checking = True\ninterpreter_python = auto_silent\n"
    "[ssh_connection]\npipelining = True\n"
)
# The same with Ansible's junit callback, whose files show which copy of the roles ran
# (JUNIT_OUTPUT_DIR names where they go).
OPERATOR_CONFIG_WITH_JUNIT = "callbacks_enabled = ansible.builtin.junit\n" + OPERATOR_CONFIG


@dataclass(frozen=True)
class Installed:
    tarball: Path
    collections: Path  # the collections path it was installed into (nothing else there)
    user_dir: Path  # a directory outside the checkout with the user's own ansible.cfg

    @property
    def config(self) -> Path:
        return self.user_dir / "ansible.cfg"

    @property
    def root(self) -> Path:
        """The installed collection's own folder (its roles, playbooks, plugins)."""
        return self.collections / INSTALLED_PATH

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) without its ``ANSIBLE_*`` settings
        and with the user's ansible.cfg: nothing of the checkout's configuration leaks in."""
        source = os.environ if base is None else base
        env = {k: v for k, v in source.items() if not k.startswith("ANSIBLE_")}
        env.update(
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', os.defpath)}",
            ANSIBLE_CONFIG=str(self.config),
            ANSIBLE_NOCOLOR="1",
        )
        return env

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            argv,
            cwd=self.user_dir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check:
            assert proc.returncode == 0, (
                f"{argv}: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc


def install_collection(base: Path, config: str = "") -> Installed:
    """Build this checkout's collection into ``base/dist``, install it into the empty
    ``base/collections`` and write ``base/user/ansible.cfg``: ``[defaults]`` with that
    collections path and ``retry_files_enabled = False``, then ``config`` (more lines of
    ``[defaults]``, or further sections)."""
    dist, collections, user = base / "dist", base / "collections", base / "user"
    user.mkdir(parents=True)
    (user / "ansible.cfg").write_text(
        f"[defaults]\ncollections_path = {collections}\nretry_files_enabled = False\n{config}"
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    build = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(REPO)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = dist.glob("kvops-gds-*.tar.gz")
    installed = Installed(tarball, collections, user)
    installed.run(
        str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "--no-deps",
        "-p", str(collections), str(tarball),
    )  # fmt: skip
    assert (installed.root / "MANIFEST.json").is_file()
    return installed
