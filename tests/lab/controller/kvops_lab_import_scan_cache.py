"""Lab controller only (a speed aid, not a double): remember which module_utils a source imports.

Before an Ansible task runs a Python module, the controller builds its AnsiballZ payload: it
parses the module and every ``ansible.module_utils``/collection module_utils file the module
reaches (``basic.py`` and ~40 more) into an AST to find their imports
(``ansible.executor.module_common.recursive_finder``). Ansible keeps the finished payload only for
the run that built it (in its per-process ``local_tmp``), so every ``ansible-playbook`` run parses
the same sources again for every module it uses: measured with py-spy on a lab converge, a quarter
of the controller's CPU (``_compile_module_ast``), on the two cores the whole suite shares.

What a source imports is a function of the source, its dotted name and whether it is a package's
``__init__`` (``ModuleDepFinder`` reads nothing else). This module keeps that answer in a private
folder per user, keyed by the SHA-256 of the three, and hands ``recursive_finder`` the same
``submodules`` and ``optional_imports`` it would have computed; a source it has not seen is parsed
and scanned by Ansible's own code. The payload built is the same: the same files, found by
Ansible's own locators, in the same order.

Loaded by ``tests/lab/controller/sitecustomize.py`` in Python processes started with the lab's
environment (``LabHosts.env``: ansible-playbook, ansible-runner's, kvops'); it patches
``ansible.executor.module_common`` when that is imported, and leaves it as it is if the names it
replaces are not there (another ansible-core).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

MODULE = "ansible.executor.module_common"
# A scan lists a source's module_utils imports: a few kB (the largest seen: 5 kB). More is not ours.
MAX_ENTRY_BYTES = 1 << 20
ImportNames = set[tuple[str, ...]]


def cache_dir_for_this_user() -> str:
    return f"/var/tmp/kvops-lab-import-scan-{os.getuid()}"


@functools.cache
def _host_aid() -> types.ModuleType:
    """The lab hosts' bytecode cache (tests/lab/files/kvops_lab_zip_bytecode.py), loaded by path
    (it is one file put into the hosts, not a package): both caches keep one rule for their
    folders. Loading it installs nothing."""
    path = os.path.join(os.path.dirname(__file__), "..", "files", "kvops_lab_zip_bytecode.py")
    spec = importlib.util.spec_from_file_location("kvops_lab_zip_bytecode", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def private_folder(path: str) -> bool:
    """This user's own folder that nobody else can write (created 0700 if missing): what it
    holds decides which files go into every module payload."""
    return bool(_host_aid().private_folder(path))


def scan_key(module_fqn: str, is_pkg_init: bool, source: str | bytes) -> str:
    raw = source.encode() if isinstance(source, str) else bytes(source)
    digest = hashlib.sha256(f"{module_fqn}\0{int(is_pkg_init)}\0".encode())
    digest.update(raw)
    return digest.hexdigest()


def _names(value: Any) -> ImportNames:
    if not isinstance(value, list) or not all(
        isinstance(name, list) and all(isinstance(part, str) for part in name) for name in value
    ):
        raise ValueError("not a list of dotted names")
    return {tuple(name) for name in value}


def load_scan(cache_dir: str, key: str) -> tuple[ImportNames, ImportNames] | None:
    """A remembered scan, or None (none yet, not readable, or not what this module writes)."""
    if not private_folder(cache_dir):
        return None
    try:
        with open(os.path.join(cache_dir, key), "rb") as entry:
            raw = entry.read(MAX_ENTRY_BYTES + 1)
        if len(raw) > MAX_ENTRY_BYTES:
            raise ValueError("larger than any scan this module writes")
        doc = json.loads(raw)
        return _names(doc["submodules"]), _names(doc["optional_imports"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store_scan(
    cache_dir: str, key: str, submodules: ImportNames, optional_imports: ImportNames
) -> None:
    """Written to a file of this process first and renamed into place: a reader in another
    worker sees a whole entry or none."""
    if not private_folder(cache_dir):
        return
    doc = {
        "submodules": sorted(list(name) for name in submodules),
        "optional_imports": sorted(list(name) for name in optional_imports),
    }
    entry = os.path.join(cache_dir, key)
    partial = f"{entry}.{os.getpid()}"
    try:
        with open(partial, "w", encoding="utf-8") as fresh:
            json.dump(doc, fresh)
        os.replace(partial, entry)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(partial)


class Unparsed:
    """What the patched ``_compile_module_ast`` returns: the source, parsed on first use of the
    tree (a scan not remembered yet; ``_get_module_metadata`` reading ``body``)."""

    def __init__(self, name: str, source: str | bytes, parse: Callable[[str, Any], Any]) -> None:
        self.name, self.source, self._parse = name, source, parse

    @functools.cached_property
    def tree(self) -> Any:
        return self._parse(self.name, self.source)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.tree, attribute)


def patch(module_common: types.ModuleType, cache_dir: str) -> bool:
    """Route ``recursive_finder``'s parse-and-scan through the cache; False (nothing changed)
    where this ansible-core does not have the two names it replaces."""
    parse = getattr(module_common, "_compile_module_ast", None)
    finder_class = getattr(module_common, "ModuleDepFinder", None)
    if not callable(parse) or not isinstance(finder_class, type):
        return False

    def compile_module_ast(module_name: str, source_code: str | bytes) -> Unparsed:
        return Unparsed(module_name, source_code, parse)

    scan = finder_class.__init__

    # Ansible's __init__ is wrapped in place, not the class replaced: it calls
    # super(ModuleDepFinder, self) by the module's global name.
    def scan_through_the_cache(
        finder: Any,
        module_fqn: str,
        tree: Any,
        is_pkg_init: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if not isinstance(tree, Unparsed) or args or kwargs:
            real = tree.tree if isinstance(tree, Unparsed) else tree
            scan(finder, module_fqn, real, is_pkg_init, *args, **kwargs)
            return
        key = scan_key(module_fqn, is_pkg_init, tree.source)
        remembered = load_scan(cache_dir, key)
        if remembered is None:
            scan(finder, module_fqn, tree.tree, is_pkg_init)
            store_scan(cache_dir, key, finder.submodules, finder.optional_imports)
            return
        finder.module_fqn, finder.is_pkg_init = module_fqn, is_pkg_init
        finder.submodules, finder.optional_imports = remembered

    module_common._compile_module_ast = compile_module_ast
    finder_class.__init__ = scan_through_the_cache
    return True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches ``ansible.executor.module_common`` right after it is first executed, in whichever
    process imports it (ansible-playbook's main process, before it forks its workers)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run_module = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run_module(module)
            patch(module, cache_dir_for_this_user())

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Called at interpreter start-up (sitecustomize): costs one list insert until Ansible's
    module_common is imported."""
    if MODULE in sys.modules:
        patch(sys.modules[MODULE], cache_dir_for_this_user())
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
