"""The probe's Python floor (3.8) checked without a 3.8 interpreter: every shipped module and
the generated program parse with Python 3.8's grammar, so a 3.9+ construct (a `match`
statement, parenthesised context managers) fails here on any machine, CI included. The probe
also runs on the oldest Python installed (tests/unit/test_probe.py)."""

from __future__ import annotations

import ast

import pytest
from old_pythons import PROBE_FLOOR

from kvops.probe.bundle import build_program, module_sources


@pytest.mark.parametrize("name", sorted(module_sources()))
def test_shipped_module_parses_with_the_floor_grammar(name: str) -> None:
    ast.parse(module_sources()[name], filename=name, feature_version=PROBE_FLOOR)


def test_generated_program_parses_with_the_floor_grammar() -> None:
    ast.parse(build_program({"host": "h"}), feature_version=PROBE_FLOOR)


def test_a_newer_construct_is_caught() -> None:
    """The check can fail: a `match` statement (3.10) is refused under the 3.8 grammar."""
    newer = "match x:\n    case 1:\n        pass\n"
    ast.parse(newer)
    with pytest.raises(SyntaxError):
        ast.parse(newer, feature_version=PROBE_FLOOR)
