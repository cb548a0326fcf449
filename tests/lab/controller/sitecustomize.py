"""Start-up hook of the Python processes the lab tests start (``LabHosts.env`` puts this folder
first on PYTHONPATH; ``site`` imports ``sitecustomize`` at start-up:
https://docs.python.org/3/library/site.html). It installs the controller's import scan cache
(kvops_lab_import_scan_cache) and then runs the ``sitecustomize`` this one hides, if the
interpreter has one further down the path."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_the_hidden_sitecustomize() -> None:
    others = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _install() -> None:
    import kvops_lab_import_scan_cache  # this folder is on PYTHONPATH (LabHosts.env)

    kvops_lab_import_scan_cache.install()


_install()
_run_the_hidden_sitecustomize()
