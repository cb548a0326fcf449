"""The judgement on top of the replays: how deltas become a verdict, the output-length flip
estimate, and the CLI's progress and Ctrl-C behaviour."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from kvops.advise import analysis as analysis_mod
from kvops.advise.analysis import AdviseOptions, Analysis, Delta
from kvops.advise.arms import ArmResult, Profiles
from kvops.advise.recommend import (
    DEPENDS,
    HELPS,
    HURTS,
    NO_GAIN,
    _classify,
    output_tokens_flip,
    verdicts,
)
from kvops.advise.sizing import SizingInputs, compute_sizing
from kvops.advise.workload import Reuse, Workload
from kvops.cli import main
from kvops.cli.advise import _progress_stage
from kvops.sim.profiles import load_gpu, load_model, load_storage

PROFILES = Profiles(
    load_model("llama-3.1-8b"), load_gpu("h100-sxm-80gb"), load_storage("ontap-nfs-rdma-200g")
)


@pytest.mark.parametrize(
    ("gains", "reading"),
    [
        ([+40.0, +30.0], HELPS),
        ([+6.0, -1.0], HELPS),
        ([+2.0, -3.0], NO_GAIN),
        ([-8.0, -2.0], HURTS),
        ([+10.0, -10.0], DEPENDS),  # faster throughput, slower first token
    ],
)
def test_classify_by_the_effect_size(gains: list[float], reading: str) -> None:
    assert _classify(gains, 5.0) == reading


def _arm(name: str, duration_s: float, ttft_s: float) -> ArmResult:
    arm = ArmResult(name, num_gpu_blocks=1000, completed=100, last_finish_s=duration_s)
    arm.prompt_tokens, arm.output_tokens = 100_000, 10_000  # 100 output tokens per request
    arm.itl_sum_s, arm.itl_count = 0.02 * 9_900, 9_900  # 20 ms ITL
    arm.e2e_sum_s = 10.0 * duration_s  # ten requests in flight on average
    arm.ttft_s = [ttft_s] * 100
    return arm


def _analysis(base: ArmResult, off: ArmResult, corner_pcts: list[dict[str, float]]) -> Analysis:
    sizing = compute_sizing(PROFILES.model, PROFILES.gpu, PROFILES.storage, SizingInputs(1000, 1))
    deltas = analysis_mod._deltas(base, off, corner_pcts)
    return Analysis(
        Workload("t", "trace", []), PROFILES, AdviseOptions(), Reuse(1, 0, 0, 0, 0), sizing,
        base, off, deltas, corner_names=["worst", "best"][: len(corner_pcts)],
        corner_pcts=corner_pcts,
    )  # fmt: skip


def test_corners_that_disagree_make_the_verdict_depend() -> None:
    base, off = _arm("baseline", 100.0, 1.0), _arm("offload", 80.0, 0.7)
    worst = {"total_token_throughput_tok_s": 1.0, "mean_ttft_ms": -2.0, "mean_itl_ms": 0.0,
             "p99_ttft_ms": 0.0}  # fmt: skip
    best = {**worst, "total_token_throughput_tok_s": 40.0, "mean_ttft_ms": -40.0}
    a = _analysis(base, off, [worst, best])
    assert verdicts(a) == (DEPENDS, [HELPS, NO_GAIN, HELPS])
    thr = a.delta("total_token_throughput_tok_s")
    assert isinstance(thr, Delta) and thr.low_pct == 1.0 and thr.high_pct == 40.0
    assert verdicts(_analysis(base, off, [best, best]))[0] == HELPS


def test_output_length_flip_dilutes_a_throughput_gain() -> None:
    base, off = _arm("baseline", 100.0, 1.0), _arm("offload", 80.0, 0.7)
    # Extra time to lose the gain down to 5%: (100 - 1.05 x 80) / 0.05 = 320 s. One more
    # output token per request adds 20 ms x 100 requests / 10 in flight = 0.2 s: 1,600 tokens
    # more than the 100 generated now.
    assert output_tokens_flip(_analysis(base, off, [])) == 1_700
    assert output_tokens_flip(_analysis(base, _arm("offload", 99.0, 1.0), [])) is None


def test_progress_stage_counts_requests() -> None:
    progress, stage = _progress_stage(True)
    assert progress is not None and stage is not None
    advance = stage("baseline", 10)
    assert advance is not None
    advance(4)
    assert progress.tasks[0].completed == 4 and progress.tasks[0].total == 10
    assert _progress_stage(False) == (None, None)


def test_ctrl_c_exits_130_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_: Any, **__: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(analysis_mod, "analyse", interrupted)
    result = CliRunner().invoke(main, ["advise", "unique-one-shot", "--quick"])
    assert result.exit_code == 130
    assert "interrupted" in result.output and "Traceback" not in result.output


def test_unreachable_setup_is_a_one_line_error() -> None:
    result = CliRunner().invoke(main, ["advise", "unique-one-shot", "--model", "llama-3.1-70b"])
    assert result.exit_code == 2
    assert result.output.startswith("kvops advise trace: error: cannot simulate this setup: no")
    assert result.output.count("\n") == 1  # one line, no traceback
