"""The cufile role and `kvops validate` share one key list, and the role writes typed values.

libcufile reads `"allow_compat_mode": "false"` (a JSON string) as a wrong value, not as false:
an inventory or `-e` that quotes a value must still produce a boolean in /etc/cufile.json, and a
value that is no boolean at all must stop the role with the key's name.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from kvops.parse.cufile import KEY_TYPES, KNOWN_KEYS

ROLE = Path(__file__).resolve().parents[2] / "roles" / "cufile"


def _filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cufile_keys", ROLE / "filter_plugins" / "cufile_keys.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_role_reads_the_same_key_list_as_validate() -> None:
    role_file = ROLE / "files" / "cufile_keys.json"
    role_keys: dict[str, str] = json.loads(role_file.read_text())["keys"]
    assert role_keys == KEY_TYPES
    assert set(role_keys) == KNOWN_KEYS
    # No second list left in the role's variables.
    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    assert "cufile_keys.json" in role_vars["_cufile_key_types"]
    assert isinstance(role_vars["_cufile_known_keys"], str)  # derived, not a literal list


def test_every_default_value_has_its_type() -> None:
    defaults: dict[str, Any] = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    typed = _filters().cufile_typed(defaults["cufile_config"], KEY_TYPES)
    assert typed["errors"] == []
    assert typed["document"] == defaults["cufile_config"]


def test_quoted_booleans_and_numbers_are_written_as_json_booleans_and_numbers() -> None:
    doc = {
        "properties": {
            "allow_compat_mode": "false",
            "use_poll_mode": "True",
            "io_batchsize": "64",
            "posix_pool_slab_size_kb": ["4", 16384],
            "rdma_dev_addr_list": ["192.0.2.11"],
        },
        "fs": {"nfs": {"mount_table": {"/mnt/kv": {"rdma_dev_addr_list": ["192.0.2.11"]}}}},
    }
    typed = _filters().cufile_typed(doc, KEY_TYPES)
    assert typed["errors"] == []
    props = typed["document"]["properties"]
    assert props["allow_compat_mode"] is False
    assert props["use_poll_mode"] is True
    assert props["io_batchsize"] == 64
    assert props["posix_pool_slab_size_kb"] == [4, 16384]
    text = json.dumps(typed["document"])
    assert '"allow_compat_mode": false' in text and '"io_batchsize": 64' in text
    assert typed["document"]["fs"] == doc["fs"]


def test_values_of_the_wrong_type_are_named() -> None:
    doc = {
        "properties": {"allow_compat_mode": "maybe", "io_batchsize": True, "io_priority": 3},
        "denylist": {"mounts": "/mnt/kv"},
    }
    errors = _filters().cufile_typed(doc, KEY_TYPES)["errors"]
    assert errors == [
        "properties.allow_compat_mode must be bool (got 'maybe')",
        "properties.io_batchsize must be int (got True)",
        "properties.io_priority must be str (got 3)",
        "denylist.mounts must be list[str] (got '/mnt/kv')",
    ]
