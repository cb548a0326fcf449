"""The strict spec loader: field metadata decides what a YAML key accepts and what --help says."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.schema import load_strict, reference, spec_field
from kvops.workload.spec import WorkloadSpec


@dataclass(frozen=True)
class Example:
    count: int = spec_field(1, minimum=1, help="How many.")
    share: float = spec_field(0.5, above=0, help="A positive share.")
    rate: float | None = spec_field(None, above=0, inf_ok=True, help="Per second.")
    mode: str = spec_field("a", choices=("a", "b"), help="Which mode.")


@pytest.mark.parametrize(
    ("data", "values"),
    [
        ({}, {}),
        ({"count": 3, "share": 1}, {"count": 3, "share": 1.0}),
        ({"rate": "inf", "mode": "b"}, {"rate": math.inf, "mode": "b"}),
        ({"rate": None}, {"rate": None}),
    ],
)
def test_good_values_load_with_their_types(data: dict[str, object], values: dict[str, Any]) -> None:
    loaded = load_strict(Example, data, "x.yaml")
    assert loaded == values and all(type(loaded[k]) is type(v) for k, v in values.items())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "x.yaml: expected a mapping of keys, got list"),
        ({"cont": 1}, "x.yaml: unknown key(s) cont; allowed: count, mode, rate, share"),
        ({"count": True}, "x.yaml: count must be an integer >= 1"),
        ({"count": 0}, "x.yaml: count must be an integer >= 1"),
        ({"count": 1.5}, "x.yaml: count must be an integer >= 1"),
        ({"share": 0}, "x.yaml: share must be a number > 0"),
        ({"share": None}, "x.yaml: share must be a number > 0"),
        ({"rate": "fast"}, "x.yaml: rate must be a number > 0, inf or null"),
        ({"mode": "c"}, "x.yaml: mode must be one of a, b"),
    ],
)
def test_bad_values_name_the_key_and_what_it_accepts(data: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_strict(Example, data, "x.yaml")
    assert str(caught.value) == message


def test_reference_lists_every_key_with_its_rule_and_default() -> None:
    text = reference(Example)
    assert "count: an integer >= 1  [default: 1]\n    How many." in text
    assert "rate: a number > 0, inf or null  [default: null]" in text


def test_ab_test_help_prints_the_workload_spec_reference() -> None:
    result = CliRunner().invoke(main, ["ab-test", "--help"])
    assert result.exit_code == 0
    for field in dataclasses.fields(WorkloadSpec):
        assert f"\n    {field.name}: " in result.output
