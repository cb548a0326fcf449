"""Which cluster `validate --ontap` reads, and with which credentials: from the inventory.

The inventory's `ontap` group has one host per cluster, carrying the same `ontap_export_*`
variables the `ontap_export` role uses (literal values: `ansible-inventory --list` does not
render templates). Credentials come from the environment (`KVOPS_ONTAP_USERNAME`,
`KVOPS_ONTAP_PASSWORD`) or from the `kvops_ontap_username` / `kvops_ontap_password`
inventory variables (vaulted, or a bare reference to a vaulted `vault_*` variable); they are
never written to evidence, reports or logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kvops.ontap.client import Credentials, OntapError
from kvops.remote.inventory import InventoryHost

ONTAP_GROUP = "ontap"
USER_ENV, PASSWORD_ENV = "KVOPS_ONTAP_USERNAME", "KVOPS_ONTAP_PASSWORD"
DEFAULT_VOLUME = "kvcache"  # the ontap_export role's default volume name


@dataclass(frozen=True)
class OntapTarget:
    name: str  # the inventory host naming the cluster (findings are filed under it)
    hostname: str  # management address, optionally host:port
    svm: str
    volume: str
    ca_file: Path | None
    credentials: Credentials


def is_ontap_host(host: InventoryHost) -> bool:
    return ONTAP_GROUP in host.groups


_REFERENCE = re.compile(r"^\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}$")


def _var(host: InventoryHost, name: str) -> str:
    """A variable's value; a bare `{{ other_var }}` reference (the vault idiom) is followed
    once, since `ansible-inventory --list` does not render templates. Nothing is evaluated."""
    value = str(host.vars.get(name) or "")
    match = _REFERENCE.match(value.strip())
    if match:
        value = str(host.vars.get(match.group(1)) or "")
    return "" if "{{" in value else value


def _credentials(host: InventoryHost, environ: Mapping[str, str]) -> Credentials:
    user = environ.get(USER_ENV) or _var(host, "kvops_ontap_username")
    password = environ.get(PASSWORD_ENV) or _var(host, "kvops_ontap_password")
    if not user or not password:
        raise OntapError(
            f"{host.name}: no ONTAP credentials: set {USER_ENV} and {PASSWORD_ENV}, or vault "
            "kvops_ontap_username / kvops_ontap_password in the inventory"
        )
    return Credentials(user, password)


def target_of(
    host: InventoryHost, ca_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> OntapTarget:
    """The cluster an `ontap` inventory host stands for; OntapError names what is missing."""
    env = os.environ if environ is None else environ
    svm = str(host.vars.get("ontap_export_svm") or "")
    if not svm:
        raise OntapError(f"{host.name}: ontap_export_svm is not set in the inventory")
    hostname = str(host.vars.get("ontap_export_hostname") or host.address)
    for value, name in ((hostname, "ontap_export_hostname"), (svm, "ontap_export_svm")):
        if "{{" in value:
            raise OntapError(f"{host.name}: {name} must be a literal, not a template")
    inventory_ca = host.vars.get("ontap_export_ca_file")
    ca = ca_file or (Path(str(inventory_ca)).expanduser() if inventory_ca else None)
    return OntapTarget(
        name=host.name,
        hostname=hostname,
        svm=svm,
        volume=str(host.vars.get("ontap_export_volume_name") or DEFAULT_VOLUME),
        ca_file=ca,
        credentials=_credentials(host, env),
    )
