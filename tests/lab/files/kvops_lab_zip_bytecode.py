"""Lab hosts only (a speed aid, not a double): keep the bytecode of modules imported from zip files.

Every Ansible task ships its module with the module_utils it needs as a zip (AnsiballZ) and runs
it with the host's Python, which imports ``ansible.module_utils.basic`` and ~40 more modules from
that zip. Python's zipimport compiles a source it finds in a zip every time and never writes
bytecode (https://docs.python.org/3/library/zipimport.html: "bytecode is not written"), so each
task spends ~0.1 CPU-s compiling the same sources: about a third of what a task costs a lab host,
on the two cores the whole suite shares.

This file and a ``.pth`` line that imports it (site runs ``import`` lines of ``.pth`` files at
start-up: https://docs.python.org/3/library/site.html) are put into every lab host by the lab
harness (tests/lab/packages.yml, host_doubles). It replaces zipimport's compile step with one that
keeps the compiled code in a private folder per user, keyed by the SHA-256 of the source, and
gives a cached code object the file name of this import (``_imp._fix_co_filename``, as importlib
does for a .pyc), so tracebacks name the zip of this run. The code run is compiled from the same
source by the same interpreter: the roles' behaviour on a lab host is unchanged. Virtual
environments (the engine's) do not read the system's ``.pth`` files and are not touched.
"""

from __future__ import annotations

import _imp
import functools
import hashlib
import marshal
import os
import stat
import sys
import types
import zipimport
from collections.abc import Callable

CompileSource = Callable[[str, bytes], types.CodeType]

# zipimport's private compile step (Lib/zipimport.py, 3.8 to 3.13); without it, nothing is done.
_ZIP_COMPILE: CompileSource | None = getattr(zipimport, "_compile_source", None)


def cache_dir_for_this_user() -> str:
    """One folder per user, interpreter and optimization level (``-O`` compiles asserts away):
    root's (become) and the login user's never mix."""
    tag = f"{sys.implementation.cache_tag}-O{sys.flags.optimize}"
    return f"/var/tmp/kvops-lab-zip-bytecode-{os.getuid()}-{tag}"


@functools.cache
def private_folder(path: str) -> bool:
    """Create ``path`` (0700) or accept it only if it is this user's own folder that nobody else
    can write: a cache another user can write into would run their code as this user. Looked at
    once per process (an Ansible module imports ~40 modules from its zip)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def cached_compile(
    pathname: str, source: bytes, cache_dir: str, compile_source: CompileSource
) -> types.CodeType:
    """zipimport's compile step, through the cache; any cache trouble means a plain compile."""
    if not private_folder(cache_dir):
        return compile_source(pathname, source)
    entry = os.path.join(cache_dir, hashlib.sha256(source).hexdigest())
    try:
        with open(entry, "rb") as cached:
            code = marshal.loads(cached.read())
        if not isinstance(code, types.CodeType):
            raise ValueError(entry)
    except (OSError, ValueError, EOFError, TypeError):
        code = compile_source(pathname, source)
        partial = f"{entry}.{os.getpid()}"
        try:
            with open(partial, "wb") as fresh:
                fresh.write(marshal.dumps(code))
            os.replace(partial, entry)  # atomic: a concurrent task reads all of it or nothing
        except OSError:
            pass
        return code
    _imp._fix_co_filename(code, pathname)  # type: ignore[attr-defined]
    return code


def install(cache_dir: str | None = None) -> None:
    """Called by the ``.pth`` line at interpreter start-up (``cache_dir``: tests only). A
    Python whose zipimport has no such step is left as it is: a ``.pth`` line that raised would
    print its traceback at every start-up of every Python on the host."""
    compile_source = _ZIP_COMPILE
    if compile_source is None:
        return
    cache_dir = cache_dir or cache_dir_for_this_user()

    def compile_through_cache(pathname: str, source: bytes) -> types.CodeType:
        return cached_compile(pathname, source, cache_dir, compile_source)

    zipimport._compile_source = compile_through_cache  # type: ignore[attr-defined]
