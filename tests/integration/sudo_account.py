"""A disposable Unix account whose sudo asks for a password, for the real-SSH become tests.

Why an account of its own: sudo never asks root for a password (sudoers(5), "authenticate":
root and a user running a command as themselves are not asked), so the passworded become path
can only be exercised by logging in as an unprivileged user. The account gets a password
(through chpasswd on stdin, never on a command line), a sudoers drop-in that requires that
password on every call (`timestamp_timeout=0`: no cached credentials between sessions, see
https://www.sudo.ws/docs/man/sudoers.man/#timestamp_timeout) and is removed, with the account,
by `remove()`. The drop-in is checked with `visudo -c` before it is moved into
/etc/sudoers.d under a name without a dot (sudo ignores names with a `.` in that directory, so
the unchecked file is never read: https://www.sudo.ws/docs/man/sudoers.man/#Including_other_files_from_within_sudoers).
Needs root (useradd, /etc/sudoers.d).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUDOERS_D = Path("/etc/sudoers.d")


def sudo_account_available() -> str | None:
    """None when an account can be made here; else why not."""
    if os.geteuid() != 0:
        return "adding a sudo account needs root"
    missing = [
        t for t in ("sudo", "visudo", "useradd", "userdel", "chpasswd") if not shutil.which(t)
    ]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/system-deps.sh installs sudo)"
    if not SUDOERS_D.is_dir():
        return f"{SUDOERS_D} does not exist (sudo's default sudoers includes it)"
    return None


@dataclass
class SudoAccount:
    name: str
    password: str
    dropin: Path

    def remove(self) -> None:
        self.dropin.unlink(missing_ok=True)
        subprocess.run(["userdel", self.name], capture_output=True, check=False)


def add_sudo_account(name: str, password: str, home: Path) -> SudoAccount:
    """Create `name` with `password`, allowed to sudo to any user with that password."""
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    dropin = SUDOERS_D / name
    account = SudoAccount(name, password, dropin)
    try:
        subprocess.run(
            ["chpasswd"], input=f"{name}:{password}\n", text=True, check=True, capture_output=True
        )
        staged = SUDOERS_D / f".{name}.staged"  # a dotted name: sudo never reads it
        staged.write_text(
            f"Defaults:{name} timestamp_timeout=0, !mail_badpass\n{name} ALL=(ALL:ALL) ALL\n"
        )
        staged.chmod(0o440)
        subprocess.run(["visudo", "-c", "-q", "-f", str(staged)], check=True, capture_output=True)
        staged.rename(dropin)
    except BaseException:
        account.remove()
        (SUDOERS_D / f".{name}.staged").unlink(missing_ok=True)
        raise
    return account
