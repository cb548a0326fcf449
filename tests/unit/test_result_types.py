"""The typed results document against a results.json written before it was typed: same bytes
back, same reports, and a clear error for a document this kvops did not write."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from kvops.abtest.result_types import ResultsFormatError, RunResults
from kvops.report.abtest_files import markdown, to_html
from kvops.report.abtest_table import render_table

FIXTURES = Path(__file__).parent.parent / "fixtures" / "abtest"
NAME = "results-v1-multi-shared-prefix"
# the plots that run wrote, in the order write_plots returns them
PLOTS = [
    Path(f"plots/multi-shared-prefix-{kind}.png")
    for kind in ("ttft-cdf", "itl-cdf", "batch-throughput")
]


def _fixture() -> str:
    return (FIXTURES / f"{NAME}.json").read_text()


def test_a_v1_document_round_trips_byte_for_byte() -> None:
    text = _fixture()
    results = RunResults.from_text(text)
    assert results.to_text() == text
    sc = results.scenarios["multi-shared-prefix"]
    offload = sc.arms["offload"]
    # the optional parts are really there, typed
    assert offload.metrics.slo_given and offload.metrics.request_goodput_req_s is not None
    assert offload.engine_emission_lag_mean_ms is not None
    assert results.model_prediction is not None
    assert results.model_prediction["multi-shared-prefix"]["offload"].mean_ttft_ms is not None
    assert sc.workload.request_order == "shuffled" and results.run_seed == 2635193785
    assert results.client.bottleneck is True


def test_the_typed_document_renders_the_reports_that_run_wrote() -> None:
    results = RunResults.from_text(_fixture())
    assert markdown(results, PLOTS, None) == (FIXTURES / f"{NAME}.report.md").read_text()
    assert to_html(results, PLOTS, None) == (FIXTURES / f"{NAME}.report.html").read_text()
    buf = io.StringIO()
    render_table(results, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "216,108.2" in out and "+104.1%" in out and "[-9.8%, +361.7%]" in out
    assert "the model predicts baseline → offload" in out
    assert "the client was the bottleneck" in out


def test_without_goodput_or_prediction_the_keys_stay_absent() -> None:
    doc = json.loads(_fixture())
    del doc["model_prediction"]
    for arm in doc["scenarios"]["multi-shared-prefix"]["arms"].values():
        del arm["metrics"]["request_goodput_req_s"]
        del arm["engine_emission_lag_mean_ms"]
    text = json.dumps(doc, indent=2) + "\n"
    results = RunResults.from_text(text)
    assert results.model_prediction is None
    assert not results.scenarios["multi-shared-prefix"].arms["baseline"].metrics.slo_given
    assert results.to_text() == text


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema_version=2), "schema_version 2"),
        (lambda d: d["client"].update(lag_ms=1.0), "unknown keys ['lag_ms']"),
        (
            lambda d: d["scenarios"]["multi-shared-prefix"]["arms"]["offload"]["metrics"].pop(
                "mean_ttft_ms"
            ),
            "missing keys ['mean_ttft_ms']",
        ),
        (
            lambda d: d["scenarios"]["multi-shared-prefix"]["workload"].update(prefix_token=1),
            "unknown key(s) prefix_token",
        ),
    ],
)
def test_a_document_kvops_did_not_write_is_refused_by_name(
    edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    doc = json.loads(_fixture())
    edit(doc)
    with pytest.raises(ResultsFormatError) as err:
        RunResults.from_json(doc)
    assert message in str(err.value)


def test_not_json_is_a_results_format_error() -> None:
    with pytest.raises(ResultsFormatError, match="not JSON"):
        RunResults.from_text("{")


def test_a_deploy_summary_rides_along_unchanged() -> None:
    doc = json.loads(_fixture())
    doc["deploy"] = {"limit": "gpu1", "inventories": ["inv"], "outcomes": [], "arms": {}}
    text = json.dumps(doc, indent=2) + "\n"
    results = RunResults.from_text(text)
    assert results.deploy is not None and results.deploy["limit"] == "gpu1"
    assert results.to_text() == text
