"""Exact prompt lengths through the server's own tokenizer: token ids by default, calibrated
text when the server refuses token ids (the fixed-delay double counts one token per word plus
a BOS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from doubles.fixed_delay_server import running

WORKLOAD = (
    "num_prefixes: 2\nprefix_tokens: 16\nprompt_tokens: 24\noutput_tokens: 3\nbatch_size: 2\n"
    "iterations: 2\n"
)


def _run(
    tmp_path: Path, a: str, b: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kvops", "ab-test", "--arm", f"baseline={a}",
           "--arm", f"offload={b}", "--workload", str(tmp_path / "w.yaml"), "--out", str(out),
           *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120), out


def _records(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]


def test_token_ids_learned_via_tokenize_are_exact(tmp_path: Path) -> None:
    with running("--vocab-size", "200") as (a, _), running("--vocab-size", "200") as (b, _):
        proc, out = _run(tmp_path, a, b)
    assert proc.returncode == 0, proc.stderr
    assert "learned through /tokenize" in json.loads((out / "alphabet.json").read_text())["how"]
    assert all(r["prompt_tokens"] == 24 and r["output_tokens"] == 3 for r in _records(out))


def test_server_refusing_token_ids_gets_calibrated_text(tmp_path: Path) -> None:
    with running("--text-only") as (a, _), running("--text-only") as (b, _):
        proc, out = _run(tmp_path, a, b)
    assert proc.returncode == 0, proc.stderr
    alphabet = json.loads((out / "alphabet.json").read_text())
    assert "refused token-id prompts" in alphabet["how"] and alphabet["special_tokens"] == 1
    assert all(r["prompt_tokens"] == 24 for r in _records(out))
    assert "different prompt length" not in (out / "report.md").read_text()


def test_vocab_size_option(tmp_path: Path) -> None:
    with running("--vocab-size", "100") as (a, _), running("--vocab-size", "100") as (b, _):
        proc, out = _run(tmp_path, a, b, "--vocab-size", "100")
    assert proc.returncode == 0, proc.stderr
    assert "--vocab-size 100" in json.loads((out / "alphabet.json").read_text())["how"]
