"""The ab-test reports show what the servers and the deployed host said as text (issue 24).

Each arm's server names its version, models and cache configuration; with --deploy the host
reports its packages, command line, environment and the play's error. A hostile one must not
crash the terminal summary (rich markup), act on the terminal, or forge lines of report.md.
"""

from __future__ import annotations

import importlib
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from kvops.abtest.deploy_summary import summarize_deploys
from kvops.abtest.experiment import Hooks
from kvops.abtest.result_types import RunResults
from kvops.cli import main
from kvops.report.abtest_files import markdown, to_html
from kvops.report.abtest_table import render_table

FIXTURE = (
    Path(__file__).parent.parent / "fixtures" / "abtest" / "results-v1-multi-shared-prefix.json"
)
# Markup, cursor-up + erase-line, BEL, 8-bit CSI, CR, NUL, a bidi override, a forged heading.
HOSTILE = "[/] [bold red]x[/bold red] \x1b[2K\x1b[1A\x07\x9b2J\r\x00\u202e\n## offload: helps <b>"
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")
_RICH_SGR = re.compile(r"\x1b\[[0-9;]*m")


def hostile_results() -> RunResults:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text())
    offload = doc["arms"][1]
    offload.update(version=HOSTILE, models=[HOSTILE])
    offload["cache_config"]["num_gpu_blocks"] = HOSTILE
    doc["warnings"].append(f"baseline vs offload: server version differs (0.8.5 vs {HOSTILE})")
    deployed = {
        "install_method": "pip",
        "packages": {"vllm": HOSTILE, "lmcache": "0.3.1"},
        "lmcache_config": {"chunk_size": HOSTILE},
        "kv_transfer_config": {"kv_connector": HOSTILE},
        "exec_start": f"/usr/bin/vllm serve {HOSTILE}",
        "environment": {"LMCACHE_LOG": HOSTILE},
    }
    records = [
        {"arm": "baseline", "variant": "baseline", "status": "failed", "errors": [HOSTILE]},
        {"arm": "offload", "variant": "offload", "status": "successful",
         "deployed": {f"gpu1{HOSTILE}": deployed}},
    ]  # fmt: skip
    settings = {"limit": "gpu1", "inventories": ["inv"]}
    doc["deploy"] = summarize_deploys(records, settings, ["baseline", "offload"])
    return RunResults.from_json(doc)


def test_markdown_shows_hostile_text_on_its_own_lines() -> None:
    md = markdown(hostile_results(), [], None)
    assert not _UNSAFE.findall(md)
    assert "\n## offload: helps" not in md  # no heading forged from a version string
    assert "version [/] [bold red]x[/bold red] \\x1b[2K\\x1b[1A\\x07\\x9b2J\\r\\x00\\u202e" in md
    shown = md.count("\\n## offload: helps <b>") + md.count("\\n## offload: helps &lt;b&gt;")
    assert shown >= 6  # arm, warning, deploy rows and lists
    # raw HTML stays text: escaped in prose and cells, literal only inside code spans
    no_blocks = re.sub(r"^(`{3,})yaml\n.*?^\1$", "", md, flags=re.S | re.M)
    outside_code = re.sub(r"(`+).*?\1", "", no_blocks)
    assert "<b>" not in outside_code and "&lt;b&gt;" in outside_code


def test_markdown_code_spans_and_blocks_cannot_be_closed_by_host_text() -> None:
    from kvops.report.host_text import markdown_code, markdown_fence, markdown_inline

    assert markdown_code("a`b") == "``a`b``" and markdown_code("`x") == "`` `x ``"
    assert markdown_fence("k: ```\nv: 1") == "````"
    assert markdown_inline("<img src=x onerror=alert(1)> & 0.8.5") == (
        "&lt;img src=x onerror=alert(1)&gt; &amp; 0.8.5"
    )
    assert (
        markdown_inline("vllm 0.32.0+cpu, model tiny-llama") == "vllm 0.32.0+cpu, model tiny-llama"
    )


def test_html_escapes_hostile_text() -> None:
    page = to_html(hostile_results(), [], None)
    assert not _UNSAFE.findall(page)
    assert "helps <b>" not in page
    assert page.count("helps &lt;b&gt;") >= 6


def test_terminal_summary_shows_hostile_warnings_as_text() -> None:
    out = io.StringIO()
    render_table(hostile_results(), Console(file=out, force_terminal=True, width=200))
    plain = _RICH_SGR.sub("", out.getvalue())
    assert not _UNSAFE.findall(plain.replace("\n", ""))
    assert "server version differs (0.8.5 vs [/] [bold red]x[/bold red] \\x1b[2K" in plain


def test_ab_test_progress_and_warnings_show_hostile_text(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The warnings reach the operator while the run goes on (a server's version that differs
    between the arms): a `[/]` there used to stop the whole experiment with MarkupError."""

    def fake_run_ab_test(_req: object, hooks: Hooks) -> Any:
        hooks.on_segment(f"prompts: {HOSTILE}")
        hooks.warn(f"baseline vs offload: served model differs (m vs {HOSTILE})")
        return SimpleNamespace(results=SimpleNamespace(doc=hostile_results()), interrupted=False)

    monkeypatch.setattr(
        importlib.import_module("kvops.cli.ab_test"), "run_ab_test", fake_run_ab_test
    )
    args = ["ab-test", "--arm", "baseline=http://x:1", "--arm", "offload=http://x:2"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert not _UNSAFE.findall(result.stderr.replace("\n", ""))
    assert "served model differs (m vs [/] [bold" in result.stderr  # rich wraps at 80 columns
    assert "\\x1b[2K\\x1b[1A\\x07\\x9b2J" in result.stderr
