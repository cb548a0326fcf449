"""The lab hosts' bytecode cache for zip imports (tests/lab/files/kvops_lab_zip_bytecode.py):
the same code runs, from the cache only when the source is the same, and tracebacks name the zip
of the import that ran; any doubt about the cache means a plain compile."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

HOOK = Path(__file__).resolve().parents[1] / "lab" / "files" / "kvops_lab_zip_bytecode.py"
SOURCE = b"def answer():\n    return 42\n\ndef fail():\n    raise RuntimeError('from the zip')\n"


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kvops_lab_zip_bytecode_under_test", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the functions; installs nothing
    return module


class CountingCompile:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, pathname: str, source: bytes) -> types.CodeType:
        self.calls.append(pathname)
        return compile(source, pathname, "exec", dont_inherit=True)


def _run(code: types.CodeType) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(code, namespace)
    return namespace


def _private(tmp_path: Path) -> str:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    return str(folder)


def test_the_second_import_of_the_same_source_comes_from_the_cache_under_its_own_name(
    hook: ModuleType, tmp_path: Path
) -> None:
    cache, counting = _private(tmp_path), CountingCompile()
    first = hook.cached_compile("/tmp/run-1/payload.zip/m.py", SOURCE, cache, counting)
    second = hook.cached_compile("/tmp/run-2/payload.zip/m.py", SOURCE, cache, counting)
    assert counting.calls == ["/tmp/run-1/payload.zip/m.py"]
    assert _run(first)["answer"]() == _run(second)["answer"]() == 42  # type: ignore[operator]
    # the module's code and the functions inside it name the second run's zip
    assert second.co_filename == "/tmp/run-2/payload.zip/m.py"
    nested = [c for c in second.co_consts if isinstance(c, types.CodeType)]
    assert nested and {c.co_filename for c in nested} == {"/tmp/run-2/payload.zip/m.py"}


def test_a_changed_source_is_compiled_again(hook: ModuleType, tmp_path: Path) -> None:
    cache, counting = _private(tmp_path), CountingCompile()
    hook.cached_compile("/z/m.py", SOURCE, cache, counting)
    changed = hook.cached_compile("/z/m.py", SOURCE.replace(b"42", b"43"), cache, counting)
    assert len(counting.calls) == 2
    assert _run(changed)["answer"]() == 43  # type: ignore[operator]


def test_a_damaged_cache_entry_is_compiled_again_and_replaced(
    hook: ModuleType, tmp_path: Path
) -> None:
    cache, counting = _private(tmp_path), CountingCompile()
    hook.cached_compile("/z/m.py", SOURCE, cache, counting)
    (entry,) = Path(cache).iterdir()
    entry.write_bytes(b"\x00not marshal")
    code = hook.cached_compile("/z/m.py", SOURCE, cache, counting)
    assert len(counting.calls) == 2 and _run(code)["answer"]() == 42  # type: ignore[operator]
    assert hook.cached_compile("/z/m.py", SOURCE, cache, counting) and len(counting.calls) == 2


def test_a_cache_folder_others_can_write_is_not_used(hook: ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)  # another user could plant code here: never read, never written
    counting = CountingCompile()
    for _ in range(2):
        hook.cached_compile("/z/m.py", SOURCE, str(folder), counting)
    assert len(counting.calls) == 2 and not list(folder.iterdir())


def test_installed_it_serves_zipimport_across_processes(hook: ModuleType, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    program = (
        "import sys, traceback\n"
        f"sys.path.insert(0, {str(HOOK.parent)!r})\n"
        "import kvops_lab_zip_bytecode\n"
        f"kvops_lab_zip_bytecode.install({str(cache)!r})\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import zipped\n"
        "print(zipped.answer())\n"
        "try:\n    zipped.fail()\n"
        "except RuntimeError as error:\n"
        "    print(traceback.extract_tb(error.__traceback__)[-1].filename)\n"
    )
    outputs = []
    for run in ("one", "two"):
        archive = tmp_path / run / "payload.zip"
        archive.parent.mkdir()
        with zipfile.ZipFile(archive, "w") as zipped:
            zipped.writestr("zipped.py", SOURCE)
        proc = subprocess.run(
            [sys.executable, "-c", program, str(archive)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ""},
        )  # fmt: skip
        outputs.append(proc.stdout.splitlines())
        assert len(list(cache.iterdir())) == 1  # one entry, written by the first run
    assert outputs[0] == ["42", str(tmp_path / "one" / "payload.zip" / "zipped.py")]
    assert outputs[1] == ["42", str(tmp_path / "two" / "payload.zip" / "zipped.py")]
