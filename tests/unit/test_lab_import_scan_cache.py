"""The lab controller's import scan cache (tests/lab/controller/): Ansible builds the same module
payloads with it as without it, takes a scan from the cache only for the same source, name and
package flag, and any doubt about the cache means Ansible's own scan."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CONTROLLER = Path(__file__).resolve().parents[1] / "lab" / "controller"

# Builds the payloads of a few builtin modules the roles use, with Ansible's own recursive_finder,
# and prints a digest of every file put into each zip (name and content) and of the metadata.
PAYLOADS = """
import datetime, hashlib, io, json, sys, zipfile
from pathlib import Path
import ansible.modules
from ansible._internal._ansiballz import _builder
from ansible.executor import module_common
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader()
if len(sys.argv) > 1:
    import kvops_lab_import_scan_cache
    assert kvops_lab_import_scan_cache.patch(module_common, sys.argv[1])
folder = Path(ansible.modules.__file__).parent
payloads = {}
for name in ["stat", "copy", "systemd_service", "uri", "apt", "pip"]:
    zf = zipfile.ZipFile(io.BytesIO(), "w")
    metadata = module_common.recursive_finder(
        name, f"ansible.modules.{name}", (folder / f"{name}.py").read_bytes(), zf,
        datetime.datetime(2020, 1, 1), _builder.ExtensionManager.create(task_vars={}))
    files = [[i.filename, hashlib.sha256(zf.read(i)).hexdigest()] for i in zf.infolist()]
    payloads[name] = [files, repr(metadata)]
print(json.dumps(payloads))
"""


def _payloads(*cache_dir: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(CONTROLLER)}
    proc = subprocess.run(
        [sys.executable, "-c", PAYLOADS, *map(str, cache_dir)],
        capture_output=True, text=True, check=True, env=env, timeout=120,
    )  # fmt: skip
    return dict(json.loads(proc.stdout))


def test_ansible_builds_the_same_payloads_with_a_cold_and_a_warm_cache(tmp_path: Path) -> None:
    cache = tmp_path / "scans"
    plain = _payloads()
    assert all(len(files) > 10 for files, _ in plain.values())  # module_utils went in
    assert _payloads(cache) == plain
    assert len(list(cache.iterdir())) > 10
    assert _payloads(cache) == plain


@pytest.fixture
def scan_cache() -> ModuleType:
    path = CONTROLLER / "kvops_lab_import_scan_cache.py"
    spec = importlib.util.spec_from_file_location("kvops_lab_import_scan_cache_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the functions; installs nothing
    return module


class _FakeModuleCommon:
    """The two names the cache replaces, as Ansible's module_common has them: a parse to an AST
    and a finder class whose __init__ scans it (counted here)."""

    def __init__(self) -> None:
        self.scans: list[str] = []
        common = self

        def _compile_module_ast(module_name: str, source_code: str | bytes) -> ast.Module:
            return ast.parse(source_code)

        class ModuleDepFinder:
            def __init__(self, module_fqn: str, tree: ast.Module, is_pkg_init: bool = False):
                common.scans.append(module_fqn)
                self.submodules = {
                    tuple(alias.name.split("."))
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Import)
                    for alias in node.names
                }
                self.optional_imports = {("optional",)} if is_pkg_init else set()

        self._compile_module_ast = _compile_module_ast
        self.ModuleDepFinder = ModuleDepFinder

    def scan(self, name: str, source: bytes, is_pkg_init: bool = False) -> Any:
        tree = self._compile_module_ast(name, source)
        return self.ModuleDepFinder(name, tree, is_pkg_init)


def _patched(scan_cache: ModuleType, cache_dir: Path) -> _FakeModuleCommon:
    common = _FakeModuleCommon()
    assert scan_cache.patch(common, str(cache_dir))
    return common


def test_the_same_source_is_scanned_once_and_a_changed_one_again(
    scan_cache: ModuleType, tmp_path: Path
) -> None:
    first = _patched(scan_cache, tmp_path / "scans")
    found = first.scan("ansible.module_utils.x", b"import ansible.module_utils.a\n")
    assert found.submodules == {("ansible", "module_utils", "a")}
    again = _patched(scan_cache, tmp_path / "scans")  # another process, same folder
    remembered = again.scan("ansible.module_utils.x", b"import ansible.module_utils.a\n")
    assert again.scans == []
    assert remembered.submodules == found.submodules
    assert remembered.optional_imports == found.optional_imports == set()
    changed = again.scan("ansible.module_utils.x", b"import ansible.module_utils.b\n")
    assert changed.submodules == {("ansible", "module_utils", "b")}
    as_package = again.scan("ansible.module_utils.x", b"import ansible.module_utils.a\n", True)
    assert as_package.optional_imports == {("optional",)}
    assert again.scans == ["ansible.module_utils.x", "ansible.module_utils.x"]


def test_a_damaged_entry_is_scanned_again_and_replaced(
    scan_cache: ModuleType, tmp_path: Path
) -> None:
    cache, source = tmp_path / "scans", b"import ansible.module_utils.a\n"
    _patched(scan_cache, cache).scan("m", source)
    (entry,) = cache.iterdir()
    oversized = json.dumps({"submodules": [["x" * 2**20]], "optional_imports": []})
    for damage in (
        "{not json",
        json.dumps({"submodules": [[1]], "optional_imports": []}),
        oversized,
    ):
        entry.write_text(damage)
        common = _patched(scan_cache, cache)
        assert common.scan("m", source).submodules == {("ansible", "module_utils", "a")}
        assert common.scans == ["m"]
        assert json.loads(entry.read_text())["submodules"] == [["ansible", "module_utils", "a"]]


def test_a_cache_folder_others_can_write_is_never_used(
    scan_cache: ModuleType, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    common = _patched(scan_cache, shared)
    common.scan("m", b"import ansible.module_utils.a\n")
    common.scan("m", b"import ansible.module_utils.a\n")
    assert common.scans == ["m", "m"]
    assert list(shared.iterdir()) == []


def test_the_tree_is_parsed_only_when_something_reads_it(
    scan_cache: ModuleType, tmp_path: Path
) -> None:
    common = _patched(scan_cache, tmp_path / "scans")
    unparsed = common._compile_module_ast("m", b"METADATA = 1\n")
    assert "tree" not in vars(unparsed)
    assert isinstance(unparsed.body[0], ast.Assign)  # as _get_module_metadata reads it


def test_another_ansible_core_is_left_as_it_is(scan_cache: ModuleType, tmp_path: Path) -> None:
    other = types.ModuleType("module_common")
    assert not scan_cache.patch(other, str(tmp_path))
    assert vars(other).keys() == {"__name__", "__doc__", "__package__", "__loader__", "__spec__"}


def test_the_sitecustomize_it_hides_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.hidden_sitecustomize_ran = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CONTROLLER), str(tmp_path)])}
    probe = (
        "import sys, kvops_lab_import_scan_cache as c\n"
        "print(sys.hidden_sitecustomize_ran, any(isinstance(f, c._PatchOnImport) "
        "for f in sys.meta_path))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    )
    assert proc.stdout.split() == ["True", "True"]
