"""Client side: turn the probe package plus one configuration into a single Python program.

Why one program on stdin: nothing is copied to or left on the target, nothing sensitive sits on
a command line, and the exact same text runs over SSH, under sudo, locally and in tests
(`python3 -`). The modules are served to the target interpreter by a small in-memory importer
under the package name `kvops_probe`, so an installed `kvops` on the host is never shadowed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

PACKAGE = "kvops_probe"
SHIPPED = ("__init__", "core", "system", "service", "storage", "main")

_LOADER = """
import sys, importlib.abc, importlib.util

class _KvopsProbeImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in _SOURCES:
            return importlib.util.spec_from_loader(name, self, is_package=(name == _PACKAGE))
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        code = compile(_SOURCES[module.__name__], "<%s>" % module.__name__, "exec")
        exec(code, module.__dict__)

sys.meta_path.insert(0, _KvopsProbeImporter())
import json
from kvops_probe.main import run
sys.exit(run(json.loads(_CONFIG)))
"""


def module_sources() -> Dict[str, str]:
    """`kvops_probe[.module]` -> source text of the shipped probe modules."""
    here = Path(__file__).parent
    sources = {}
    for mod in SHIPPED:
        name = PACKAGE if mod == "__init__" else "%s.%s" % (PACKAGE, mod)
        sources[name] = (here / ("%s.py" % mod)).read_text(encoding="utf-8")
    return sources


def build_program(config: Dict[str, Any]) -> str:
    """The whole probe as one program for `python3 -`, with `config` embedded as JSON."""
    header = (
        "# kvops probe (generated): reads the host, prints one JSON evidence document\n"
        "import sys\n"
        "if sys.version_info < (3, 8):\n"
        "    sys.stderr.write('kvops probe needs Python >= 3.8 on the host, found %s "
        "(set ansible_python_interpreter)\\n' % sys.version.split()[0])\n"
        "    sys.exit(3)\n"
    )
    return (
        header
        + "_PACKAGE = %r\n" % PACKAGE
        + "_SOURCES = %r\n" % module_sources()
        + "_CONFIG = %r\n" % json.dumps(config, sort_keys=True)
        + _LOADER
    )
