"""`kvops explain RUNDIR`: where each arm's prompt tokens came from, and why offload paid or not."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console

from kvops.abtest.explain import Explanation, explain_scenario
from kvops.abtest.result_types import ResultsFormatError, RunResults
from kvops.advise.storage_evidence import StorageFacts
from kvops.errors import RC, KvopsError
from kvops.report.explain import (
    precondition_lines,
    token_source_lines,
    verdict_text,
)
from kvops.report.host_text import markup

EPILOG = """
\b
Examples:
  kvops explain runs/demo
  kvops explain runs/ab-gpu1 --evidence evidence/gpu1 --model llama-3.1-8b --gpu h100-sxm-80gb
  kvops explain runs/ab-gpu1 --evidence evidence/gpu1 --json
\b
The break-even read bandwidth is `kvops advise sizing`'s: the bandwidth at which loading a
stored prefix takes as long as recomputing it on the GPU (model and GPU profiles; embedded runs
use their own). Exit codes: 0 explained; 2 no run directory, unreadable results or bundle.
"""


class ExplainError(KvopsError, ValueError):
    """A run directory or bundle explain cannot read (exit code 2)."""


def load_results(run_dir: Path) -> RunResults:
    """The run's results.json, or rebuilt from its files when it has none yet."""
    path = run_dir / "results.json"
    if path.is_file():
        try:
            return RunResults.from_text(path.read_text(encoding="utf-8"))
        except (ResultsFormatError, OSError) as exc:
            raise ExplainError(f"{path}: {exc}") from None
    if not (run_dir / "run.json").is_file():
        raise ExplainError(f"{run_dir}: not an ab-test run directory (no results.json, run.json)")
    from kvops.abtest.results import build_results
    from kvops.abtest.rundir import RunDir

    return build_results(RunDir(run_dir)).doc


def _profiles(
    run_dir: Path, doc: RunResults, model: str | None, gpu: str | None
) -> tuple[str, str, list[str]]:
    """Model and GPU profile names for break-even: given, the embedded run's own (run.json),
    or matched from the served model name (the GPU then assumed, with a note)."""
    from kvops.sim.profiles import known_names, load_model

    notes: list[str] = []
    try:
        run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        run = {}
    sim = run.get("sim") if isinstance(run, dict) and isinstance(run.get("sim"), dict) else None
    if model is None:
        served = next((m for a in doc.arms for m in (a.models or [])), None)
        for name in known_names("model"):
            if served and load_model(name).hf_name.lower() == served.lower():
                model = name
        if model is None:
            model = str((sim or {}).get("model") or "llama-3.1-8b")
            notes.append(f"model profile {model} assumed (--model to choose)")
    if gpu is None:
        gpu = str((sim or {}).get("gpu") or "h100-sxm-80gb")
        if not doc.embedded_engines:
            notes.append(f"GPU profile {gpu} assumed (--gpu to choose)")
    return model, gpu, notes


def break_even(model: str, gpu: str, prefix_tokens: int) -> float | None:
    from kvops.sim.costs import CostModel
    from kvops.sim.profiles import ProfileError, load_gpu, load_model

    if prefix_tokens < 1:
        return None
    try:
        costs = CostModel(load_gpu(gpu), load_model(model))
    except ProfileError as exc:
        raise ExplainError(str(exc)) from None
    return costs.break_even_read_bandwidth_gb_s(prefix_tokens)


def _facts(evidence: Path | None) -> StorageFacts | None:
    if evidence is None:
        return None
    from kvops.advise.storage_evidence import storage_facts
    from kvops.validate.judge import EvidenceError, load_evidence

    try:
        documents = load_evidence(evidence)
    except EvidenceError as exc:
        raise ExplainError(str(exc)) from None
    return storage_facts(documents, str(evidence))


@click.command("explain", epilog=EPILOG)
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--evidence",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="A `kvops validate --storage-bench --save-evidence DIR` bundle of the offload host.",
)
@click.option("--model", default=None, help="Model profile for break-even (default: matched).")
@click.option("--gpu", default=None, help="GPU profile for break-even (default: the run's).")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
def explain(
    run_dir: Path, evidence: Path | None, model: str | None, gpu: str | None, as_json: bool
) -> RC:
    """Where each arm's prompt tokens came from, and the cause of the result, per scenario.

    Per arm: prompt tokens looked up, served from the GPU prefix cache, loaded from the offload
    tier and computed (the engines' own counters over the measured iterations); the verdict's
    preconditions; and one line naming the cause of a loss or a null result with its figures,
    joined with the storage evidence of a validate bundle when --evidence is given.
    """
    doc = load_results(run_dir)
    model, gpu, notes = _profiles(run_dir, doc, model, gpu)
    facts = _facts(evidence)
    out: dict[str, object] = {"run_dir": str(run_dir), "notes": notes, "scenarios": {}}
    if facts is not None:
        out["storage"] = facts.to_json()
    console = Console(soft_wrap=False)
    for name, sc in doc.scenarios.items():
        even = break_even(model, gpu, sc.workload.prefix_tokens) if facts is not None else None
        why: list[Explanation] = explain_scenario(name, sc, doc.arm_names, facts, even)
        out["scenarios"][name] = {  # type: ignore[index]
            "verdict": sc.verdict,
            "checks": sc.checks.to_json() if sc.checks is not None else None,
            "break_even_read_gb_s": even,
            "explanations": [e.to_json() for e in why],
        }
        if as_json:
            continue
        console.print(f"[bold]{markup(name)}[/]: {markup(verdict_text(sc))}")
        for line in token_source_lines(sc.checks) + precondition_lines(sc.checks):
            console.print(f"  [dim]{markup(line)}[/]")
        if sc.checks is None:
            console.print("  [dim]no engine counters in this run (kvops before issue 27)[/]")
        for e in why:
            console.print(f"  why ({markup(e.arm)}): {markup(e.line)}")
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return RC.OK
    if facts is not None:
        for line in facts.notes:
            console.print(f"[dim]storage: {markup(line)}[/]")
    for line in notes:
        console.print(f"[dim]note: {markup(line)}[/]")
    return RC.OK
