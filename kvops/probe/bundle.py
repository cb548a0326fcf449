"""Client side: turn the probe package plus one configuration into a single Python program.

Why one program on stdin: nothing is copied to or left on the target, nothing sensitive sits on
a command line, and the exact same text runs over SSH, under sudo, locally and in tests
(`python3 -S -`). The modules are served to the target interpreter by a small in-memory importer
under the package name `kvops_probe`, so an installed `kvops` on the host is never shadowed.

What it costs the host: most of the probe's CPU is the interpreter starting and importing the
stdlib, so the program is shipped to start cheaply. The target's Python runs with `-S` (no
`site`: the probe needs nothing from site-packages); the importer is a plain meta-path finder
(`importlib.abc`/`importlib.util` would import `importlib.resources` and more); the cyclic
garbage collector is off for this short, bounded run (the probe builds no cycles worth
collecting). Together: about 11% fewer instructions in the probe's own process on Python 3.11
(valgrind, recorded host tree), the same evidence.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Dict, Tuple

PACKAGE = "kvops_probe"
SHIPPED = ("__init__", "core", "redact", "system", "service", "storage", "main")
# How the target interpreter runs the program: without `site`, the program on stdin.
INTERPRETER_ARGS: Tuple[str, ...] = ("-S", "-")

_LOADER = """
from importlib.machinery import ModuleSpec

class _KvopsProbeImporter(object):
    def find_spec(self, name, path=None, target=None):
        if name in _SOURCES:
            return ModuleSpec(name, self, is_package=(name == _PACKAGE))
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


@functools.lru_cache(maxsize=1)
def _sources_literal() -> str:
    """The shipped sources as a Python literal: read once per run, not once per host."""
    return repr(module_sources())


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
        "import gc\n"
        "gc.disable()\n"
    )
    return (
        header
        + "_PACKAGE = %r\n" % PACKAGE
        + "_SOURCES = %s\n" % _sources_literal()
        + "_CONFIG = %r\n" % json.dumps(config, sort_keys=True)
        + _LOADER
    )
