"""`kvops explain` and the ab-test report's "why" line (issue 27): the cause of a loss or a null
result in one line with its figures, joined with a validate bundle's storage evidence
(recorded bundles: tests/fixtures/evidence/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvops.abtest.explain import explain_scenario
from kvops.abtest.result_types import RunResults, ScenarioResult
from kvops.abtest.validity import HOST_OVERLOADED, check_scenario
from kvops.advise.storage_evidence import StorageFacts, storage_facts
from kvops.cli import main
from kvops.sim.costs import CostModel
from kvops.sim.profiles import load_gpu, load_model
from kvops.validate.judge import load_evidence

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent.parent / "fixtures"
RESULTS = FIXTURES / "abtest" / "results-v1-multi-shared-prefix.json"
ARMS = ["baseline", "offload"]
INFOS = {
    "baseline": {"cache_config": {"num_gpu_blocks": "1393", "block_size": "16"}},
    "offload": {"cache_config": {"num_gpu_blocks": "1393", "block_size": "16"},
                "connector": "LMCacheConnectorV1"},
}  # fmt: skip
BASE = {"gpu_query_tokens": 240_000.0, "gpu_hit_tokens": 100_000.0}


def offload(loaded: float, stored: float = 30_000.0) -> dict[str, float]:
    return {"gpu_query_tokens": 240_000.0, "gpu_hit_tokens": 100_000.0,
            "external_query_tokens": 140_000.0, "external_hit_tokens": loaded,
            "lmcache_stored_tokens": stored}  # fmt: skip


def scenario(loaded: float, stored: float = 30_000.0) -> ScenarioResult:
    """The recorded multi-shared-prefix run (verdict: no significant difference) with the
    engine counters of an offload arm that loaded `loaded` tokens."""
    doc = RunResults.from_text(RESULTS.read_text())
    sc = doc.scenarios["multi-shared-prefix"]
    sc.checks = check_scenario(
        sc.workload, ARMS, INFOS, {"baseline": BASE, "offload": offload(loaded, stored)},
        {"baseline": 0.42, "offload": 0.42 + loaded / 240_000},
    )  # fmt: skip
    sc.verdict = sc.checks.verdict or sc.verdict
    return sc


def break_even(prefix_tokens: int) -> float:
    costs = CostModel(load_gpu("h100-sxm-80gb"), load_model("llama-3.1-8b"))
    return costs.break_even_read_bandwidth_gb_s(prefix_tokens)


def test_storage_slower_than_break_even_is_named_with_its_figures() -> None:
    facts = storage_facts(load_evidence(FIXTURES / "evidence" / "healthy"), "healthy")
    # the recorded bench: 4K random GPU-direct reads at 0.569 GiB/s = 0.61 GB/s
    assert facts.read_gb_s == pytest.approx(0.6112, abs=1e-3) and not facts.compat
    even = break_even(1400)
    assert even > facts.read_gb_s
    (why,) = explain_scenario("multi-shared-prefix", scenario(90_000.0), ARMS, facts, even)
    assert why.cause == "slow_storage"
    assert "storage slower than break-even: gdsio read 0.61 GB/s on netapp-rdma-ok" in why.line
    assert f"break-even {even:.2f} GB/s for 1400-token prefixes" in why.line
    assert "offload loaded 90,000 prompt tokens (38%)" in why.line
    # without the bundle it says what is missing instead of guessing
    (bare,) = explain_scenario("multi-shared-prefix", scenario(90_000.0), ARMS)
    assert bare.cause == "unexplained" and "--evidence" in bare.line


def test_never_engaged_names_the_evidence_behind_it() -> None:
    sc = scenario(0.0)
    assert sc.verdict == "offload never engaged"
    facts = StorageFacts("bundle", unstable_hash=["gpu1 GDS-062: PYTHONHASHSEED unset"])
    (why,) = explain_scenario("multi-shared-prefix", sc, ARMS, facts)
    assert why.cause == "never_engaged"
    assert "loaded 0 of 240,000 prompt tokens" in why.line
    assert "chunk keys change between processes (gpu1 GDS-062" in why.line
    big_chunks = StorageFacts("bundle", chunk_sizes={"gpu1": 2048})
    (chunk,) = explain_scenario("multi-shared-prefix", sc, ARMS, big_chunks)
    assert "chunk_size 2048 on gpu1 exceeds the 1400-token prefixes" in chunk.line
    (nothing,) = explain_scenario("multi-shared-prefix", scenario(0.0, stored=0.0), ARMS)
    assert "stored nothing either" in nothing.line
    dropped = scenario(0.0, stored=0.0)
    assert dropped.checks is not None
    dropped.checks.token_sources["offload"].failed_stores = 12.0
    (drop,) = explain_scenario("multi-shared-prefix", dropped, ARMS)
    assert "LMCache dropped 12 stores (lmcache:put_failed_count)" in drop.line


def test_a_withheld_verdict_is_explained_by_the_host_not_the_storage() -> None:
    """Even beside a bundle whose storage is slower than break-even, a verdict withheld for an
    overloaded host is not pinned on the storage: the run measured the host."""
    sc = scenario(90_000.0)
    sc.verdict = HOST_OVERLOADED
    facts = storage_facts(load_evidence(FIXTURES / "evidence" / "healthy"), "healthy")
    (why,) = explain_scenario("multi-shared-prefix", sc, ARMS, facts, break_even(1400))
    assert why.cause == "host_overloaded"
    assert "measured this host's CPU, not offload" in why.line and "--sim-time-scale" in why.line


def test_compat_mode_in_the_bundle_is_found() -> None:
    facts = storage_facts(load_evidence(FIXTURES / "evidence" / "fleet"), "fleet")
    assert any(line.startswith("compat-only GDS-051") for line in facts.compat)


def test_explain_command_joins_the_run_and_the_bundle(tmp_path: Path) -> None:
    doc = RunResults.from_text(RESULTS.read_text())
    doc.scenarios["multi-shared-prefix"] = scenario(90_000.0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(doc.to_text())
    evidence = str(FIXTURES / "evidence" / "healthy")
    args = ["explain", str(run), "--evidence", evidence, "--gpu", "h100-sxm-80gb"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    sc = out["scenarios"]["multi-shared-prefix"]
    assert sc["explanations"][0]["cause"] == "slow_storage"
    assert sc["break_even_read_gb_s"] == pytest.approx(break_even(1400))
    tokens = sc["checks"]["token_sources"]["offload"]
    assert (tokens["offload_tokens"], tokens["gpu_cache_tokens"]) == (90_000.0, 100_000.0)
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0 and "why (offload): storage slower than break-even" in text.output
    missing = CliRunner().invoke(main, ["explain", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not an ab-test run directory" in missing.output
