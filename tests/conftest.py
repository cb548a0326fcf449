"""Test tiers: the folder a test lives in gives its marker (unit, integration, lab, engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "integration", "lab", "engine")
TESTS_ROOT = Path(__file__).parent


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark each test with its folder's tier as it is collected, so `-m unit` selects it."""
    try:
        tier = Path(item.fspath).relative_to(TESTS_ROOT).parts[0]
    except ValueError:
        return
    if tier in TIERS and not any(item.get_closest_marker(t) for t in TIERS):
        item.add_marker(getattr(pytest.mark, tier))
