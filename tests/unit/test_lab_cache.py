"""Old test repos are pruned from the cache unless a lab state still refers to them."""

from __future__ import annotations

import json
from pathlib import Path

from kvops.lab.lab import prune_repos


def test_prune_keeps_the_current_repo_and_those_a_lab_uses(tmp_path: Path) -> None:
    cache, labs = tmp_path / "cache", tmp_path / "labs"
    for name in ("repo-old", "repo-used", "repo-new", "repo-new2.partial"):
        (cache / name).mkdir(parents=True)
    (labs / "slot3").mkdir(parents=True)
    state = {
        "slot": 3,
        "name_prefix": "kvlab",
        "bridge": "kvopsbr3",
        "gateway_ip": "10.200.3.1",
        "inventory_dir": "/x",
        "base_dir": "/y",
        "repo_dir": str(cache / "repo-used"),
        "started_at": 0.0,
        "hosts": [],
    }
    (labs / "slot3" / "state.json").write_text(json.dumps(state))
    prune_repos(cache, labs, keep=cache / "repo-new")
    assert sorted(p.name for p in cache.iterdir()) == ["repo-new", "repo-new2.partial", "repo-used"]
