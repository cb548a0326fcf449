"""Judges survive any evidence: a malformed item from an old or broken probe must give a
finding, never a crash (a crashed check is reported as `Check crashed`)."""

from __future__ import annotations

from typing import Any

import evidence_builders as eb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvops.validate.judge import judge

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _mutate(data: st.DataObject, node: Any, depth: int) -> Any:
    """Replace the value `depth` levels down a random path of `node` (a copy) with arbitrary
    JSON; the depth is drawn first so that deep values get replaced as often as shallow ones."""
    children: list[Any] = []
    if isinstance(node, dict):
        children = list(node)
    elif isinstance(node, list):
        children = list(range(len(node)))
    if not children or depth == 0:
        return data.draw(JSON, label="replacement")
    key = data.draw(st.sampled_from(children), label="descend")
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[key] = _mutate(data, node[key], depth - 1)
    return copy


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_malformed_evidence_never_crashes_a_check(data: st.DataObject) -> None:
    doc = eb.healthy()
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        part = data.draw(st.sampled_from(["items", "settings"]))
        doc[part] = _mutate(data, doc[part], data.draw(st.integers(1, 7), label="depth"))
    crashed = [f.message for f in judge(doc) if f.title == "Check crashed"]
    assert crashed == []


# Found by fuzzing deeper than the property test reaches in its budget; kept as regressions.
MALFORMED: list[tuple[str, list[str | int], Any]] = [
    ("http_health", ["http_status"], "x"),
    ("http_models", ["http_status"], {"a": 1}),
    ("gds_dir", ["source"], [1, 2]),
    ("infiniband", ["data", "devices"], [True, 1]),
    ("infiniband", ["data", "devices", 0, "ports"], True),
    ("infiniband", ["data", "devices", 0, "ports", 0, "rate"], ". Gb/sec"),
    ("gds_dir", ["data", "tmp_files"], 3),
    ("vllm_process", ["data", "argv"], [1, None]),
]


@pytest.mark.parametrize(("item_id", "path", "value"), MALFORMED)
def test_known_malformed_values(item_id: str, path: list[str | int], value: Any) -> None:
    doc = eb.healthy()
    node: Any = doc["items"][item_id]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    if item_id == "gds_dir":
        doc["items"]["gds_dir"]["data"]["tmp_file_count"] = 1
    crashed = [f.message for f in judge(doc) if f.title == "Check crashed"]
    assert crashed == []


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_malformed_evidence_never_crashes_the_shared_store_judges(data: st.DataObject) -> None:
    """The fleet judges (GDS-090..092) read two hosts that share a directory, one mutated."""
    from kvops.checks.shared_store import judge_shared_stores

    doc, other = eb.healthy(), eb.healthy()
    other["host"] = "other"
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        part = data.draw(st.sampled_from(["items", "settings"]))
        doc[part] = _mutate(data, doc[part], data.draw(st.integers(1, 7), label="depth"))
    found = judge_shared_stores([doc, other])
    assert sorted(f.check_id for f in found["other"]) == ["GDS-090", "GDS-091", "GDS-092"]
