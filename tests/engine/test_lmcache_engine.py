"""The real LMCache (the role's pinned version, the role's rendered settings) offloads and returns
the right KV, and kvops's judge catches it when it silently does not.

- store -> POST /reset_prefix_cache -> the same prefix hits: full 256-token chunks only, chunk
  files in LMCache's GDS layout under gds_path, LMCache's own counters rise, and greedy
  completions with logprobs are the same as computed without LMCache (the baseline engine);
- a fresh process on the same gds_path (what a restart, or another host on the same export,
  is): its very first request hits the chunks the offload engine wrote, by LMCache's and vLLM's
  counters (lmcache:num_hit_tokens, vllm:external_prefix_cache_hits) and cached_tokens;
- negative control: that second engine's device-seam double zeroes V on load, and it answers
  differently, so the comparison above can see wrong KV; `kvops smoke` FAILs it (GDS-207, the
  first differing token named) while every counter rises;
- LMCache without the device seam (what any initialisation failure on a GPU host looks like):
  /health 200, "degraded mode" in the log, `kvops validate`'s GDS-066 FAILs on that real log
  while it PASSes on the working engine's log, and `kvops smoke --service-log` FAILs (GDS-208).

The two extra engines start together when this module begins and stop when it ends.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from evidence_builders import command, edited, findings_for
from greedy_requests import greedy_completion, post_json, same_answer

from kvops.parse.prometheus import parse_prometheus_text

if TYPE_CHECKING:
    from conftest import Engine

Cli = Callable[..., subprocess.CompletedProcess[str]]
# The control engines' smoke: one short prompt (two chunks) keeps it to a few requests.
SHORT_SMOKE = ("--prompts", "1", "--prompt-tokens", "512", "--json")

pytestmark = pytest.mark.timeout(1500)  # the first test may pay for the engine install

VOCAB = 2048  # the tiny model's tokenizer; ids 0-2 are special
CHUNK = 256  # the role's vllm_lmcache_chunk_size
PREFIX_TOKENS = 1600  # 6 full chunks (1,536 tokens) + 64 tokens LMCache does not store
STORED = PREFIX_TOKENS // CHUNK * CHUNK
SEED = 25


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_prometheus_text(resp.read().decode()).counter_value(name) or 0.0


def _poll_counter(url: str, name: str, at_least: float, timeout_s: float = 30.0) -> float:
    """LMCache pushes its counters periodically: right after a request they can still read the
    old value. Poll until `at_least` or the timeout, and return the last value read."""
    deadline = time.monotonic() + timeout_s
    value = _counter(url, name)
    while value < at_least and time.monotonic() < deadline:
        time.sleep(1.0)
        value = _counter(url, name)
    return value


def _chunk_files(gds: Path) -> set[Path]:
    return {p for p in gds.rglob("*.kvcache.safetensors") if p.is_file()}


def _new_chunk_files(gds: Path, before: set[Path], at_least: int) -> set[Path]:
    """LMCache's GDS backend writes in the background: poll (<= 15 s) for `at_least` files."""
    deadline = time.monotonic() + 15.0
    new = _chunk_files(gds) - before
    while len(new) < at_least and time.monotonic() < deadline:
        time.sleep(0.5)
        new = _chunk_files(gds) - before
    return new


def _lmcache_lines(engine: Engine, response_id: str) -> list[str]:
    """LMCache's log lines for one request (its req_id is vLLM's, `<response id>-<n>-<suffix>`)."""
    return [ln for ln in engine.log_text().splitlines() if f"{response_id}-" in ln]


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(SEED)
    return [rng.randrange(3, VOCAB) for _ in range(PREFIX_TOKENS + 3)]


@pytest.fixture(scope="module")
def control_engines(
    engines: dict[str, Engine],
    engine_launcher: Callable[..., Engine],
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Engine]]:
    """Two more LMCache engines of the role's offload variant, launched together (waited for by
    the tests that use them): `zero_v` on the offload engine's gds_path with the seam double
    zeroing V on load; `no_seam` without the double."""
    offload = engines["offload"]
    assert offload.kv_dir is not None
    venv = Path(offload.args[0]).parents[1]
    root = tmp_path_factory.mktemp("control-engines")
    started = {
        "zero_v": engine_launcher(
            "offload-zero-v",
            venv,
            tiny_model,
            "offload",
            root / "zero-v",
            gds_dir=offload.kv_dir,
            extra_env={"KVOPS_TEST_LMCACHE_SEAM_CORRUPT": "zero-v"},
        ),
        "no_seam": engine_launcher(
            "offload-no-seam", venv, tiny_model, "offload", root / "no-seam", seam=False
        ),
    }
    try:
        yield started
    finally:
        for engine in started.values():
            engine.stop()


def test_lmcache_stores_full_chunks_and_returns_the_same_kv_after_a_prefix_cache_reset(
    baseline_engine: Engine,
    offload_engine: Engine,
    prompt: list[int],
    tiny_model: Path,
    request: pytest.FixtureRequest,
) -> None:
    url, gds = offload_engine.url, offload_engine.kv_dir
    assert gds is not None
    files0 = _chunk_files(gds)
    stored0 = _counter(url, "lmcache:num_stored_tokens")
    hit0 = _counter(url, "lmcache:num_hit_tokens")
    external0 = _counter(url, "vllm:external_prefix_cache_hits")

    cold = greedy_completion(url, prompt)
    assert cold["cached_tokens"] == 0, cold
    # only the full chunks: 1,536 of the 1,603 prompt tokens
    stored_line = f"Stored {STORED} out of total {STORED} tokens"
    assert any(stored_line in ln for ln in _lmcache_lines(offload_engine, cold["id"])), (
        _lmcache_lines(offload_engine, cold["id"])
    )
    # the counter also carries what earlier tests stored and LMCache had not published yet
    stored = _poll_counter(url, "lmcache:num_stored_tokens", stored0 + STORED) - stored0
    assert stored >= STORED, f"lmcache:num_stored_tokens rose by {stored}, expected {STORED}"
    new = _new_chunk_files(gds, files0, STORED // CHUNK)
    assert len(new) == STORED // CHUNK, sorted(str(p) for p in new)
    # LMCache's GDS layout: <gds_path>/<2 hex>/<2 hex>/<model>@<world>@<worker>@<hash>@<dtype>
    # .kvcache.safetensors (quoted), with its .metadata beside it
    for path in new:
        rel = path.relative_to(gds)
        assert re.fullmatch(r"[0-9a-f-]{2}", rel.parts[0]) and len(rel.parts) == 3, rel
        name = urllib.parse.unquote(rel.parts[2])
        assert re.fullmatch(
            re.escape(str(tiny_model)) + r"@1@0@[0-9a-f-]+@float\.kvcache\.safetensors", name
        ), name
        assert Path(str(path) + ".metadata").is_file()
    # The control engines start now, with these chunk files on disk, so that the one on this
    # gds_path finds them in its start-up scan (the next test); they start while this one ends.
    request.getfixturevalue("control_engines")

    post_json(url + "/reset_prefix_cache")
    warm = greedy_completion(url, prompt)
    assert warm["cached_tokens"] == STORED, warm  # came back from LMCache, not vLLM's cache
    retrieved_line = f"Retrieved {STORED} out of {STORED} required tokens"
    assert any(retrieved_line in ln for ln in _lmcache_lines(offload_engine, warm["id"]))
    hits = _poll_counter(url, "lmcache:num_hit_tokens", hit0 + STORED) - hit0
    assert hits >= STORED
    assert _counter(url, "vllm:external_prefix_cache_hits") - external0 >= STORED

    without = greedy_completion(baseline_engine.url, prompt)  # computed by a vLLM without LMCache
    assert same_answer(warm, cold), (warm, cold)
    assert same_answer(warm, without), (warm, without)


def _smoke_items(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return {i["name"]: i for i in json.loads(proc.stdout)["items"]}


def test_a_fresh_process_on_the_same_gds_path_hits_first_and_wrong_kv_fails_smoke(
    offload_engine: Engine,
    baseline_engine: Engine,
    control_engines: dict[str, Engine],
    prompt: list[int],
    kvops_cli: Cli,
) -> None:
    """Same gds_path, another process started after the offload engine wrote its chunks (a
    restart, or another host on the same export): LMCache's start-up scan reads them, and its
    first request hits them, from the files. The double zeroes V as it loads them: the answer
    changes, and smoke's correctness check says so."""
    zero_v = control_engines["zero_v"]
    zero_v.wait_ready()
    url = zero_v.url
    # LMCache's GdsBackend logs the chunks its start-up scan found ("Read %s cache entries from
    # persistent storage"): at least the previous test's. In 0.5.6 that scan can lose a race with
    # its own constructor and stop at the first metadata file (then validate's GDS-066 WARNs);
    # the first request below hits either way, through the on-demand lookup.
    log = zero_v.log_text()
    scanned = [int(n) for n in re.findall(r"Read (\d+) cache entries from persistent storage", log)]
    stopped = "during GDS start" in log and "_use_noatime" in log
    assert (scanned and scanned[0] >= STORED // CHUNK) or stopped, (scanned, zero_v.log_tail())
    assert not (scanned and stopped), "a scan both finished and stopped"
    if stopped:
        from kvops.checks.lmcache import JOURNAL_WARNINGS, journal_problems

        warned, _ = journal_problems(log.splitlines(), JOURNAL_WARNINGS)
        assert warned and "on-demand lookups only" in warned[0], warned
    assert _counter(url, "lmcache:num_hit_tokens") == 0
    corrupted = greedy_completion(url, prompt)  # this process's first request
    assert corrupted["cached_tokens"] == STORED, corrupted  # the KV did come from LMCache
    assert "LMCache hit tokens: 1536" in zero_v.log_text()
    assert _poll_counter(url, "lmcache:num_hit_tokens", STORED) >= STORED
    assert _counter(url, "vllm:external_prefix_cache_hits") >= STORED
    right = greedy_completion(baseline_engine.url, prompt)
    assert not same_answer(corrupted, right), (corrupted, right)

    proc = kvops_cli("smoke", "--url", url, *SHORT_SMOKE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    items = _smoke_items(proc)
    kv = items["kv_correct"]
    assert kv["status"] == "FAIL", kv
    assert re.search(r"(token|logprob) \d+ differs: recomputed id \d+ \(logprob -?[\d.]+\), "
                     r"from offload id \d+ \(logprob -?[\d.]+\)", kv["message"]), kv  # fmt: skip
    # LMCache did store and retrieve: only the correctness check sees the wrong KV
    assert items["stored_tokens"]["status"] == "PASS", items["stored_tokens"]
    assert items["retrieved_tokens"]["status"] == "PASS", items["retrieved_tokens"]


def test_lmcache_without_its_device_seam_is_healthy_but_degraded_and_validate_and_smoke_fail_it(
    offload_engine: Engine, control_engines: dict[str, Engine], prompt: list[int], kvops_cli: Cli
) -> None:
    """What any LMCache initialisation failure looks like (on a GPU host e.g. a cuFile
    registration error): /health 200, a request answered by recompute, and only the log says
    it. kvops's GDS-066 reads the engine's real log as the vllm_journal item."""
    no_seam = control_engines["no_seam"]
    no_seam.wait_ready()  # /health 200
    answer = greedy_completion(no_seam.url, prompt)
    assert answer["cached_tokens"] == 0
    log = no_seam.log_text()
    assert "Failed to initialize LMCacheManager components" in log
    assert "degraded mode" in log

    def journal(text: str) -> dict[str, Any]:
        return command(["journalctl", "--no-pager", "-o", "cat", "-n", "3000"], text)

    [(severity, message)] = findings_for(edited(vllm_journal=journal(log)), "GDS-066")
    assert severity == "FAIL", message
    assert "Failed to initialize LMCacheManager components" in message
    # and the working engine's real log, LMCache's and the double's lines included, passes
    [(severity, message)] = findings_for(
        edited(vllm_journal=journal(offload_engine.log_text())), "GDS-066"
    )
    assert severity == "PASS", message

    # kvops smoke reads the same start's log: degraded mode is a FAIL with the lines
    proc = kvops_cli(
        "smoke", "--url", no_seam.url, "--service-log", str(no_seam.log_path), *SHORT_SMOKE
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    item = _smoke_items(proc)["service_log"]
    assert item["status"] == "FAIL", item
    assert "'Failed to initialize LMCacheManager components'" in item["message"]
    assert "'degraded mode'" in item["message"]
    [finding] = [
        f for f in json.loads(proc.stdout)["hosts"][no_seam.url]["findings"]
        if f["check_id"] == "GDS-208"
    ]  # fmt: skip
    assert "degraded mode" in finding["evidence"] and "first LMCache ERROR" in finding["remedy"]
