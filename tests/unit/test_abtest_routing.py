"""An arm of several endpoints: its --arm syntax, and which instance serves each request
(kvops.abtest.routing)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.abtest.arms import Arm, parse_arm
from kvops.abtest.deploy import DeployError, DeploySettings, deploy_arms
from kvops.abtest.routing import ROUTES, route_requests
from kvops.cli import main

PLAN = [0, 1, 0, 1, None, 0, None, 1]  # prefix ids in send order (None: no shared prefix)


def test_round_robin_ignores_prefixes() -> None:
    assert route_requests(PLAN, 2, "round-robin") == [0, 1, 0, 1, 0, 1, 0, 1]
    assert route_requests(PLAN, 3, "round-robin") == [0, 1, 2, 0, 1, 2, 0, 1]


def test_prefix_affinity_keeps_each_prefix_on_one_instance() -> None:
    got = route_requests(PLAN, 2, "prefix-affinity")
    assert got == [0, 1, 0, 1, 0, 0, 1, 1]
    homes = {p: {i for q, i in zip(PLAN, got, strict=True) if q == p} for p in (0, 1)}
    assert homes == {0: {0}, 1: {1}}


def test_prefix_handoff_moves_every_reuse_to_another_instance() -> None:
    got = route_requests(PLAN, 2, "prefix-handoff")
    assert got == [0, 1, 1, 0, 0, 0, 1, 1]
    for p in (0, 1):
        where = [i for q, i in zip(PLAN, got, strict=True) if q == p]
        assert all(a != b for a, b in itertools.pairwise(where)), where


def test_one_instance_gets_everything_and_bad_input_is_refused() -> None:
    for route in ROUTES:
        assert route_requests(PLAN, 1, route) == [0] * len(PLAN)
    with pytest.raises(ValueError, match="unknown route 'sticky'"):
        route_requests(PLAN, 2, "sticky")
    with pytest.raises(ValueError, match="at least one instance"):
        route_requests(PLAN, 0, "round-robin")


def test_an_arm_of_several_urls_parses_and_bad_lists_are_named() -> None:
    arm = parse_arm("offload=http://a:8000/, http://b:8000")
    assert arm == Arm("offload", "http://a:8000", None, ("http://b:8000",))
    assert arm.urls == ("http://a:8000", "http://b:8000")
    assert parse_arm("base=http://a:8000").urls == ("http://a:8000",)
    for bad, says in (
        ("offload=http://a:8000,,http://b:8000", "URL 2 of 3 is empty"),
        ("offload=http://a:8000,", "URL 2 of 2 is empty"),
        ("offload=http://a:8000,b:8000", "URL 2 ('b:8000') is not http://HOST:PORT"),
        ("offload=http://a:8000,http://a:8000/", "http://a:8000 is listed twice"),
        ("offload=", "expected NAME=http://HOST:PORT"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_arm(bad)


def test_the_cli_teaches_fleets_and_refuses_a_route_with_nothing_to_spread() -> None:
    helped = CliRunner().invoke(main, ["ab-test", "--help"])
    assert helped.exit_code == 0
    for word in ("FLEETS", "--route prefix-handoff", "cross_instance_hit_share"):
        assert word in helped.output
    lonely = CliRunner().invoke(
        main, ["ab-test", "--arm", "a=http://h:1", "--arm", "b=http://h:2", "--route",
               "prefix-handoff"],
    )  # fmt: skip
    assert lonely.exit_code == 2
    assert "--route spreads an arm of several endpoints" in lonely.output
    empty = CliRunner().invoke(main, ["ab-test", "--arm", "a=http://h:1", "--arm", "b=http://h:2,"])
    assert empty.exit_code == 2 and "URL 2 of 2 is empty" in empty.output


def test_deploy_takes_no_arm_of_its_own() -> None:
    result = CliRunner().invoke(
        main, ["ab-test", "--deploy", "--limit", "g", "--arm", "b=http://h:1",
               "--arm", "o=http://h:2,http://h:3"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--deploy names its arms by --deploy-variants, not --arm" in result.output


def test_deploy_over_several_hosts_makes_each_arm_a_fleet_of_them(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  children:\n    gpu_hosts:\n      hosts:\n"
        "        gpu1: {ansible_host: 10.0.0.1}\n"
        "        gpu2: {ansible_host: 10.0.0.2, vllm_lmcache_port: 8100}\n"
        "        gpu3: {ansible_host: 10.0.0.3}\n"
    )
    settings = DeploySettings(None, [str(inventory)], "gpu1,gpu2")
    arms = deploy_arms(settings, ["baseline", "offload"], "m")
    assert [a.name for a in arms] == ["baseline", "offload"]
    for arm in arms:
        assert arm.urls == ("http://10.0.0.1:8000", "http://10.0.0.2:8100")
    [one, _] = deploy_arms(
        DeploySettings(None, [str(inventory)], "gpu3"), ["baseline", "offload"], None
    )
    assert one.urls == ("http://10.0.0.3:8000",)  # one host: one endpoint, as before
    with pytest.raises(DeployError, match="no hosts matched"):
        deploy_arms(
            DeploySettings(None, [str(inventory)], "nothere*"), ["baseline", "offload"], None
        )
