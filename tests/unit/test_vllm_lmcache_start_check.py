"""The vllm_lmcache role's start check names LMCache's degraded mode on the real log.

The check (tasks/wait_healthy.yml, "Fail on a silent LMCache fallback") searches the lines of
this start for `vllm_lmcache_fallback_patterns`. Here its own expression is rendered with
Ansible's templar and the role's own defaults/vars over two real service logs recorded in the
engine tier (tests/fixtures/lmcache/README.md): LMCache 0.5.6 failing to initialise inside vLLM
(healthy on /health, "degraded mode (recompute)") and a healthy start. Nothing of the patterns is
copied here, so a pattern edited in the role is what this test judges.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from role_files import role_vars_file

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "vllm_lmcache"
LOGS = ROOT / "tests" / "fixtures" / "lmcache"
DEGRADED = LOGS / "vllm-lmcache-0.5.6-degraded-start.log"
HEALTHY = LOGS / "vllm-lmcache-0.5.6-healthy-start.log"
CHECK_TASK = "wait_healthy | Fail on a silent LMCache fallback"

pytestmark = pytest.mark.unit

# LMCache 0.5.6's log format (lmcache/logging.py): "[<time>] LMCache <LEVEL>:" opens a record,
# "(<file>.py:<line>:<logger>)" closes it (a traceback in between spans several lines).
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_HEADER = re.compile(r"^\[[^\]]+\] LMCache (?P<level>[A-Z]+):")
_ORIGIN = re.compile(r"\((?P<file>[\w.]+\.py):\d+:(?P<logger>[\w.]+)\)\s*$")


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    """Every task of a task file, those inside blocks included."""
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always"):
            yield from _tasks(node.get(key))


def _check_expression() -> str:
    tasks = yaml.safe_load((ROLE / "tasks" / "wait_healthy.yml").read_text())
    [task] = [t for t in _tasks(tasks) if t.get("name") == CHECK_TASK]
    expression: str = task["vars"]["_vllm_lmcache_fallback_lines"]
    return expression


def flagged(lines: list[str]) -> list[str]:
    """The lines the role's start check fails the play on, rendered as the play renders them."""
    variables: dict[str, Any] = {}
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
        variables.update(role_vars_file(path))
    variables["_vllm_lmcache_log_lines"] = lines
    templar = Templar(loader=DataLoader(), variables=variables)
    result = templar.template(trust_as_template(_check_expression()))
    assert isinstance(result, list), result
    return [str(line) for line in result]


def manager_failure_lines(lines: list[str]) -> list[str]:
    """The first and last line of each record LMCache's LMCacheManager (lmcache/v1/manager.py)
    wrote at ERROR or WARNING: its initialisation failure and what it skipped because of it."""
    out: list[str] = []
    start: int | None = None
    level = ""
    for i, raw in enumerate(lines):
        line = _ANSI.sub("", raw)
        header = _HEADER.match(line)
        if header is not None:
            start, level = i, header["level"]
        origin = _ORIGIN.search(line)
        if start is not None and origin is not None:
            if origin["logger"] == "lmcache.v1.manager" and level in ("ERROR", "WARNING"):
                out += [lines[start]] if start == i else [lines[start], raw]
            start = None
    return out


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_the_start_check_flags_every_degraded_mode_line_of_the_real_log() -> None:
    lines = _lines(DEGRADED)
    failures = manager_failure_lines(lines)
    # the recorded start: the init failure (head and tail of its record) and the skipped post_init
    assert len(failures) == 3, failures
    assert "degraded mode" in _ANSI.sub("", failures[1])
    found = flagged(lines)
    assert set(failures) <= set(found), sorted(set(failures) - set(found))
    # and nothing else: the later RPC timeout and the traceback's own lines are not named
    assert set(found) == set(failures), sorted(set(found) - set(failures))


def test_the_start_check_passes_a_healthy_start_with_lmcache() -> None:
    lines = _lines(HEALTHY)
    # the healthy log is LMCache's too: its lines are there, and none is a manager failure
    assert sum("LMCache INFO" in _ANSI.sub("", ln) for ln in lines) > 10
    assert manager_failure_lines(lines) == []
    assert flagged(lines) == []


def test_the_failure_reader_finds_a_record_it_is_shown() -> None:
    """The reader of LMCache's records is itself checked: a manager WARNING is found, another
    logger's ERROR is not."""
    lines = [
        "[2026-12-05 09:06:28,141] LMCache WARNING: skipped (manager.py:189:lmcache.v1.manager)",
        "[2026-12-05 09:06:57,685] LMCache ERROR: Timeout (zmq.py:121:lmcache.v1.rpc.zmq)",
    ]
    assert manager_failure_lines(lines) == lines[:1]
