"""The local lab: disposable Debian test hosts for running the Ansible roles for real.

Needs root. Each host is an overlayfs over one cached Debian root filesystem, in its own network
namespace on a private bridge (10.200.<slot>.0/24, no forwarding from it, global ``ip_forward``
untouched: nothing leaves the machine), its own mount/UTS/PID namespaces, with sshd as PID 1
and ``CAP_SYS_MODULE`` dropped. The recipe: ``tests/lab/README.md``; the namespaces:
https://man7.org/linux/man-pages/man7/namespaces.7.html.

Public API: :class:`kvops.lab.lab.Lab` (up/down/status), :class:`kvops.lab.config.LabConfig`.
"""

from __future__ import annotations

from kvops.lab.config import LabConfig
from kvops.lab.errors import LabError

__all__ = ["LabConfig", "LabError"]
