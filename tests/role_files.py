"""Reading a role's YAML the way Ansible does, for tests that render its expressions.

Ansible marks the role's own files as trusted templates
(https://docs.ansible.com/ansible/latest/porting_guides/porting_guide_core_2.19.html, "Data
tagging"); `yaml.safe_load` does not, and an untrusted string is never templated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.template import trust_as_template


def trusted(value: Any) -> Any:
    """`value` with every string in it marked as a trusted template."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [trusted(v) for v in value]
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    return value


def role_vars_file(path: Path) -> dict[str, Any]:
    """A role's defaults/vars file as Ansible would load it (an empty file: no variables)."""
    loaded: dict[str, Any] = trusted(yaml.safe_load(path.read_text()) or {})
    return loaded
