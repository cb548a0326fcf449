"""The run directory: everything needed to re-read, re-report or resume a run.

Layout (all text):
  run.json          arms (names, URLs), options, scenarios, kvops version, attempts
  workloads/*.yaml  the exact (scaled) spec of each scenario
  workloads/*.trace.jsonl  the trace a `--trace` scenario replays (a copy)
  alphabet.json     what prompts are built from (same prompts again on --resume)
  arms.json         each arm's self-description per attempt (/version, models, cache config)
  records.jsonl     one line per request, written as it completes
  segments.jsonl    one line per finished (scenario, trial, arm) segment, with client health
  deploys.jsonl     --deploy only: one line per deploy.yml run (kvops.abtest.deploy)
  results.json, report.md, report.html, plots/*.png   written at the end (also after Ctrl-C)
Why a separate segments file: resume must know which segments finished, and a segment whose
records stop halfway is re-run rather than half-counted.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvops import __version__
from kvops.errors import KvopsError
from kvops.workload.generate import Alphabet
from kvops.workload.record import JsonlWriter, iter_jsonl
from kvops.workload.spec import WorkloadSpec, load_spec_file


class RunDirError(KvopsError, RuntimeError):
    pass


@dataclass
class RunDir:
    path: Path

    @property
    def records_path(self) -> Path:
        return self.path / "records.jsonl"

    @property
    def segments_path(self) -> Path:
        return self.path / "segments.jsonl"

    def create(self, run: dict[str, Any], specs: list[WorkloadSpec], overwrite: bool) -> None:
        if (self.path / "run.json").exists():
            measured = self.records_path.exists() and self.records_path.stat().st_size > 0
            if measured and not overwrite:
                raise RunDirError(
                    f"{self.path} already holds a run; use --resume {self.path} to continue it, "
                    "--overwrite to replace it, or another --out"
                )
            for name in ("records.jsonl", "segments.jsonl", "arms.json", "alphabet.json"):
                (self.path / name).unlink(missing_ok=True)
        (self.path / "workloads").mkdir(parents=True, exist_ok=True)
        for spec in specs:
            if spec.trace is not None:
                # the run keeps its own copy: --resume and the reports replay and read the
                # trace that was measured, whatever becomes of the operator's file
                copy = f"{spec.name}.trace.jsonl"
                try:
                    shutil.copyfile(spec.trace, self.path / "workloads" / copy)
                except OSError as exc:
                    raise RunDirError(f"cannot copy {spec.trace}: {exc.strerror}") from None
                spec = dataclasses.replace(spec, trace=copy)
            (self.path / "workloads" / f"{spec.name}.yaml").write_text(spec.to_yaml())
        run = {**run, "kvops_version": __version__, "created_unix_s": time.time(), "attempts": []}
        self.write_json("run.json", run)

    def load_run(self) -> tuple[dict[str, Any], list[WorkloadSpec]]:
        try:
            run = json.loads((self.path / "run.json").read_text())
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{self.path} is not a kvops ab-test run directory ({exc})") from None
        specs = [load_spec_file(self.path / "workloads" / f"{n}.yaml") for n in run["scenarios"]]
        specs = [
            s if s.name == n else _renamed(s, n)
            for s, n in zip(specs, run["scenarios"], strict=True)
        ]
        return run, specs

    def add_attempt(self) -> str:
        run = json.loads((self.path / "run.json").read_text())
        attempt = f"a{len(run['attempts'])}-"
        run["attempts"].append({"id": attempt, "started_unix_s": time.time()})
        self.write_json("run.json", run)
        return attempt

    def write_json(self, name: str, obj: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
        tmp.replace(self.path / name)

    def read_json(self, name: str) -> Any:
        p = self.path / name
        return json.loads(p.read_text()) if p.exists() else None

    def save_alphabet(self, alphabet: Alphabet, how: str) -> None:
        self.write_json("alphabet.json", {"how": how, **alphabet.to_dict()})

    def load_alphabet(self) -> tuple[Alphabet, str] | None:
        d = self.read_json("alphabet.json")
        return (Alphabet.from_dict(d), str(d.get("how", ""))) if d else None

    def record_arms(self, attempt: str, infos: list[dict[str, Any]]) -> None:
        history = self.read_json("arms.json") or {}
        history[attempt] = infos
        self.write_json("arms.json", history)

    def done_segments(self) -> dict[tuple[str, int, str], str]:
        """(scenario, trial, arm) -> attempt id of the finished segment."""
        return {
            (d["scenario"], int(d["trial"]), d["arm"]): d["attempt"]
            for d in iter_jsonl(self.segments_path)
            if d.get("status") == "done"
        }

    @property
    def deploys_path(self) -> Path:
        return self.path / "deploys.jsonl"

    def deploy_records(self) -> list[dict[str, Any]]:
        """deploys.jsonl's lines in run order ([] for a run without --deploy)."""
        return list(iter_jsonl(self.deploys_path))

    def segment_writer(self) -> JsonlWriter:
        return JsonlWriter(self.segments_path)

    def record_writer(self) -> JsonlWriter:
        return JsonlWriter(self.records_path)


def _renamed(spec: WorkloadSpec, name: str) -> WorkloadSpec:
    import dataclasses

    return dataclasses.replace(spec, name=name)
