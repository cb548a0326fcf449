"""`kvops ab-test --trace` before anything runs: the help teaches it, a bad trace is a one-line
usage error naming the line, and the run directory keeps the trace it replays (for --resume)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kvops.abtest.rundir import RunDir
from kvops.cli import main
from kvops.workload.replay import load_trace, trace_spec

LINES = [
    {"session_id": "s", "timestamp": 0, "input_length": 100, "output_length": 4},
    {"session_id": "s", "delay": 10, "input_length": 50, "output_length": 4},
]


def _trace(tmp_path: Path, lines: list[dict[str, object]]) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_help_teaches_traces_and_sessions() -> None:
    result = CliRunner().invoke(main, ["ab-test", "--help"])
    assert result.exit_code == 0
    for text in ("--trace FILE", "TRACES (--trace FILE)", '"session_id"', "closed loop"):
        assert text in result.output, text


def test_a_trace_it_cannot_place_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    path = _trace(tmp_path, [{"delay": 10, "input_length": 50, "output_length": 4}])
    result = CliRunner().invoke(main, ["ab-test", "--trace", str(path), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "t.jsonl:1: delay without session_id" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_trace_excludes_other_workloads_and_sweeps(tmp_path: Path) -> None:
    path = _trace(tmp_path, LINES)
    both = CliRunner().invoke(main, ["ab-test", "--trace", str(path), "--scenario", "all"])
    assert both.exit_code == 2 and "one of --scenario, --workload and --trace" in both.output
    sweep = CliRunner().invoke(main, ["ab-test", "--trace", str(path), "--sweep", "rate=1,2"])
    assert sweep.exit_code == 2 and "a --trace is replayed as recorded" in sweep.output
    workers = CliRunner().invoke(main, ["ab-test", "--trace", str(path), "--workers", "2"])
    assert workers.exit_code == 2 and "a trace's sessions are sent from one" in workers.output


def test_the_run_directory_keeps_its_own_copy_of_the_trace(tmp_path: Path) -> None:
    path = _trace(tmp_path, LINES)
    spec = trace_spec(path, load_trace(path), 0.5)
    run_dir = RunDir(tmp_path / "run")
    run_dir.create({"scenarios": [spec.name]}, [spec], overwrite=False)
    path.write_text("changed\n")  # the operator's file may change or go: the run keeps its own
    _, (loaded,) = run_dir.load_run()
    assert loaded.trace == str(tmp_path / "run" / "workloads" / "t.trace.jsonl")
    assert (loaded.trace_scale, loaded.prompt_tokens) == (0.5, 50 + 2 + 25)
    assert load_trace(Path(loaded.trace)).num_requests == 2


def test_a_workload_yaml_may_name_a_trace_beside_it(tmp_path: Path) -> None:
    from kvops.cli.ab_test import _scenarios

    _trace(tmp_path, LINES)
    (tmp_path / "mine.yaml").write_text("name: mine\ntrace: t.jsonl\nhash_block_tokens: 64\n")
    (spec,) = _scenarios(None, tmp_path / "mine.yaml", 1.0)
    assert (spec.name, spec.trace, spec.hash_block_tokens) == (
        "mine",
        str(tmp_path / "t.jsonl"),
        64,
    )
    assert spec.prompt_tokens == 100 + 4 + 50 and spec.total_requests == 2
    sweep = CliRunner().invoke(
        main, ["ab-test", "--workload", str(tmp_path / "mine.yaml"), "--sweep", "rate=1,2"]
    )
    assert sweep.exit_code == 2 and "a trace is replayed as recorded" in sweep.output
