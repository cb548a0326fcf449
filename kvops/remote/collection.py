"""Where kvops finds its Ansible content: the kvops.gds collection, installed or from a checkout.

Ansible runs a collection's playbook by its fully qualified name (``kvops.gds.deploy``) from
whichever collections path holds it (https://docs.ansible.com/ansible/latest/collections_guide/
collections_using_playbooks.html#using-a-playbook-from-a-collection). kvops runs the same names
in both places it lives:

- installed (``pip install kvops`` plus ``ansible-galaxy collection install kvops.gds``): the
  user's own Ansible configuration decides everything - ``ansible.cfg`` found the usual way
  (``ANSIBLE_CONFIG``, ``./ansible.cfg``, ``~/.ansible.cfg``), its collections path, inventory,
  forks; kvops adds nothing;
- a kvops checkout (``galaxy.yml`` at its root): the checkout itself is the collection, put on
  the collections path through a link in a private temporary folder (the layout Ansible needs
  is ``<path>/ansible_collections/kvops/gds``), ahead of anything installed, so the playbooks
  and the probe module that run are the checkout's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

NAMESPACE = "kvops"
NAME = "gds"
COLLECTION = f"{NAMESPACE}.{NAME}"
# ansible-core's default COLLECTIONS_PATHS (https://docs.ansible.com/ansible/latest/reference_appendices/config.html#collections-paths)
DEFAULT_COLLECTIONS_PATHS = "~/.ansible/collections:/usr/share/ansible/collections"


def playbook(name: str) -> str:
    """The fully qualified name of one of the collection's playbooks (``site``, ``validate``)."""
    return f"{COLLECTION}.{name}"


def checkout_root(start: Path | None = None) -> Path | None:
    """The kvops checkout around ``start`` (default: the working directory) that is the
    collection's source: it has ``galaxy.yml`` naming kvops.gds and the playbooks."""
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        meta = candidate / "galaxy.yml"
        if meta.is_file() and (candidate / "playbooks").is_dir() and (candidate / "kvops").is_dir():
            text = meta.read_text(encoding="utf-8")
            if f"namespace: {NAMESPACE}" in text and f"name: {NAME}" in text:
                return candidate
    return None


@contextmanager
def collection_env(
    root: Path | None, environ: Mapping[str, str] | None = None
) -> Iterator[dict[str, str]]:
    """Environment variables for an ansible-* run that resolves ``kvops.gds``.

    ``root`` None: none (the installed collection, the user's configuration). A checkout: its
    link first on ``ANSIBLE_COLLECTIONS_PATH``, then the paths already set there, else Ansible's
    defaults (the dependencies - ansible.posix, netapp.ontap ... - still come from the user's
    paths or the ``ansible`` package). The folder is removed on exit."""
    if root is None:
        yield {}
        return
    env = os.environ if environ is None else environ
    with tempfile.TemporaryDirectory(prefix="kvops-collection-") as tmp:
        parent = Path(tmp) / "ansible_collections" / NAMESPACE
        parent.mkdir(parents=True)
        (parent / NAME).symlink_to(root.resolve(), target_is_directory=True)
        rest = env.get("ANSIBLE_COLLECTIONS_PATH") or DEFAULT_COLLECTIONS_PATHS
        yield {"ANSIBLE_COLLECTIONS_PATH": f"{tmp}:{rest}"}
