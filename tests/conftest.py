"""Test tiers: the folder a test lives in gives its marker (unit, integration, lab, engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "lab", "engine")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).parent
    for item in items:
        try:
            tier = Path(item.fspath).relative_to(tests_root).parts[0]
        except ValueError:
            continue
        if tier in TIERS and not any(item.iter_markers(name=t) for t in TIERS):
            item.add_marker(getattr(pytest.mark, tier))
