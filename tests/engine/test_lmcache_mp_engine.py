"""The role's offload_mp variant on the real, unpatched LMCache server: `lmcache server` and a
CPU vLLM with LMCacheMPConnector, both started from what roles/vllm_lmcache renders (the
server's command line and environment, vLLM's command line with the connector JSON and its
environment file). No test double: LMCache's server mode runs on the CPU as shipped.

One start of both processes serves every assertion of the first run; one restart of both (L1
empty) proves the file tier:

- the flags the role records for the server (files/lmcache_server_flags.json) are exactly those
  of this LMCache's own `lmcache server --help`;
- store: the first request (computed by vLLM, the reference) is stored by the server: its log,
  its `lmcache_mp_*` counters on /metrics, `*.data` files of the fs L2 adapter in the GDS dir;
- retrieve: after POST /reset_prefix_cache the same prompt is served from LMCache
  (cached_tokens) with the same greedy tokens and logprobs;
- after restarting both processes the very first request hits from the file tier (the server's
  "(0 L1, N L2)" prefetch) with the same output;
- neither log shows what the role's start check fails on.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template
from greedy_requests import greedy_completion, post_json, same_answer
from measuring import ahead_of_the_lab_groups, weighed_as_this_session

from kvops.parse.prometheus import parse_prometheus_text
from kvops.smoke.judge import LMCACHE_HIT, LMCACHE_STORED
from kvops.smoke.run import lmcache_server_counters

if TYPE_CHECKING:
    from conftest import Engine, RoleRendering

pytestmark = pytest.mark.timeout(1500)  # the first test may pay for the engine install

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "vllm_lmcache"
RUNS = REPO / "runs" / "engine"
FLAG_DOC: dict[str, Any] = json.loads((ROLE / "files" / "lmcache_server_flags.json").read_text())
DEFAULTS: dict[str, Any] = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
VOCAB = 2048  # the tiny model's tokenizer; ids 0-2 are special
CHUNK = 256  # the role's vllm_lmcache_chunk_size
PREFIX_TOKENS = 1600  # 6 full chunks (1,536 tokens) + 64 the server does not store
STORED = PREFIX_TOKENS // CHUNK * CHUNK
SEED = 2505
SERVER_START_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


@dataclass
class Server:
    """One running `lmcache server` (its own process group) as the role's unit runs it."""

    argv: list[str]
    env: dict[str, str]
    http_url: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lmcache server exited:\n{self.log_tail()}")
            try:
                _get(self.http_url + "/healthcheck", 2.0)
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"lmcache server not healthy:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with_group = os.getpgid(self.proc.pid)
            os.killpg(with_group, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(with_group, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def counters(self) -> dict[str, float]:
        """The server's lmcache_mp_* counters, summed over their labels."""
        metrics = parse_prometheus_text(_get(self.http_url + "/metrics"))
        names = {s.name for s in metrics.samples if s.name.startswith("lmcache_mp_")}
        return {name: metrics.counter_value(name) or 0.0 for name in names}


@dataclass
class MpDeployment:
    server: Server
    gds: Path
    start_engine: Callable[[], Engine]
    engine: Engine | None = None


def _render_server(variables: dict[str, object]) -> tuple[list[str], dict[str, str]]:
    """The server unit's ExecStart and environment file, rendered from the role's expressions
    (vars/main.yml, templates/lmcache_server.env.j2) with the role's own filters."""
    import shlex

    # the role calls its filters by FQCN (kvops.gds.*): resolve the collection as a play run
    # from the checkout does (ansible.cfg's collections_path starts with .collections)
    init_plugin_loader([str(REPO / ".collections")])
    # what the role's lookup('file', 'lmcache_server_flags.json') reads inside a play
    templar = Templar(
        loader=DataLoader(), variables={**variables, "_vllm_lmcache_server_flag_doc": FLAG_DOC}
    )
    argv = shlex.split(
        str(templar.template(trust_as_template("{{ _vllm_lmcache_mp_exec_start }}")))
    )
    text = str(
        templar.template(
            trust_as_template((ROLE / "templates" / "lmcache_server.env.j2").read_text())
        )
    )
    env = dict(
        line.split("=", 1)
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    )
    problems = templar.template(
        trust_as_template(
            "{{ _vllm_lmcache_mp_flags | kvops.gds.lmcache_server_flag_problems("
            "_vllm_lmcache_server_flag_doc, vllm_lmcache_lmcache_version,"
            " vllm_lmcache_mp_extra_known_flags) }}"
        )
    )
    assert problems == [], problems  # the role's own refusal would stop the play
    return argv, env


@pytest.fixture(scope="module")
def mp(
    engine_venv: Path,
    tiny_model: Path,
    engine_launcher: Callable[..., Engine],
    tmp_path_factory: pytest.TempPathFactory,
    role_renderer: Callable[..., RoleRendering],
) -> Iterator[MpDeployment]:
    root = tmp_path_factory.mktemp("offload-mp")
    gds = root / "gds"
    gds.mkdir()
    port, http_port = _free_port(), _free_port()
    role_vars: dict[str, object] = {
        "vllm_lmcache_mp_port": port,
        "vllm_lmcache_mp_http_port": http_port,
        "vllm_lmcache_mp_l1_size_gb": 0.5,  # a 2-core, few-GB test host
    }
    rendering = role_renderer(
        "offload_mp",
        vllm_lmcache_venv_path=str(engine_venv),
        vllm_lmcache_gds_dir=str(gds),
        vllm_lmcache_service_home=str(root / "home"),
        vllm_lmcache_config_dir=str(root / "etc"),
        **role_vars,
    )
    argv, server_env = _render_server(rendering.variables)
    (root / "home").mkdir()
    RUNS.mkdir(parents=True, exist_ok=True)
    log_path = RUNS / "lmcache-server-offload_mp.log"
    log_path.unlink(missing_ok=True)
    server = Server(
        argv,
        {**os.environ, **server_env},
        f"http://127.0.0.1:{http_port}",
        log_path,
    )

    launched: list[int] = []

    def start_engine() -> Engine:
        engine = engine_launcher(
            "offload_mp",
            engine_venv,
            tiny_model,
            "offload_mp",
            root / "engine",
            gds_dir=gds,
            role_vars=role_vars,
        )
        launched.append(engine.proc.pid)
        return engine

    deployment = MpDeployment(server, gds, start_engine)
    try:
        server.start()
        deployment.engine = start_engine()
        deployment.engine.wait_ready()
        yield deployment
    finally:
        if deployment.engine is not None:
            deployment.engine.stop()
        server.stop()
        _forget(launched)


def _forget(pids: list[int]) -> None:
    """Take this module's stopped engines out of the tier's record of engines to reap at the
    next start (tests/engine/conftest.py): a recycled process-group id must not be killed."""
    record = RUNS / "engine-pgids.txt"
    if record.exists():
        kept = [ln for ln in record.read_text().splitlines() if ln.strip() not in map(str, pids)]
        record.write_text("".join(f"{ln}\n" for ln in kept))


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    rng = random.Random(SEED)
    return [rng.randrange(3, VOCAB) for _ in range(PREFIX_TOKENS)]


def _help_flags(venv: Path) -> set[str]:
    out = subprocess.run(
        [str(venv / "bin" / "lmcache"), "server", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LMCACHE_DISABLE_BANNER": "1", "LMCACHE_TRACK_USAGE": "false"},
        check=True,
    ).stdout
    # argparse's usage lists every flag once (wrapped lines joined); its option lines add the
    # long spelling of the short ones (-q, --quiet)
    usage = " ".join(out[out.index("usage:") : out.index("options:")].split())
    flags = set(re.findall(r"\[(-q|--[a-z0-9][a-z0-9-]*)[ \]]", usage))
    flags |= set(re.findall(r"\| (--[a-z0-9][a-z0-9-]*)[ \]]", usage))
    flags |= set(re.findall(r"^ {2}-[a-z], (--[a-z0-9-]+)", out, re.MULTILINE))
    return flags - {"-h", "--help"}


def _poll(read: Callable[[], float], at_least: float, timeout_s: float = 30.0) -> float:
    """The server publishes its counters periodically: poll, do not read once."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while value < at_least and time.monotonic() < deadline:
        time.sleep(1.0)
        value = read()
    return value


def _data_files(gds: Path) -> set[Path]:
    return {p for p in gds.rglob("*.data") if p.is_file()}


def _fallback_lines(text: str) -> list[str]:
    patterns = (
        DEFAULTS["vllm_lmcache_mp_fallback_patterns"] + DEFAULTS["vllm_lmcache_fallback_patterns"]
    )
    return [ln for ln in text.splitlines() if any(p in ln for p in patterns)]


def test_the_role_records_exactly_the_server_flags_of_the_pinned_lmcache(engine_venv: Path) -> None:
    assert _help_flags(engine_venv) == set(FLAG_DOC["flags"])


def test_store_retrieve_and_a_first_request_hit_from_the_file_tier_after_a_restart(
    mp: MpDeployment,
    prompt: list[int],
    kvops_cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    server = mp.server
    assert mp.engine is not None
    first = greedy_completion(mp.engine.url, prompt)  # computed by vLLM itself: the reference
    assert first["cached_tokens"] == 0
    stored_log = _poll(lambda: float(len(re.findall(r"Stored \d+ tokens", server.log_text()))), 1.0)
    assert stored_log >= 1, server.log_tail()
    files = _poll(lambda: float(len(_data_files(mp.gds))), STORED // CHUNK)
    assert files >= STORED // CHUNK, f"fs L2 files in {mp.gds}: {sorted(_data_files(mp.gds))}"

    post_json(mp.engine.url + "/reset_prefix_cache")
    second = greedy_completion(mp.engine.url, prompt)
    assert second["cached_tokens"] >= STORED, second
    assert same_answer(first, second), (first, second)
    assert re.search(r"Retrieved \d+ tokens", server.log_text()), server.log_tail()
    counters = server.counters()
    assert any(v > 0 for k, v in counters.items() if "store" in k), counters
    assert any(v > 0 for k, v in counters.items() if "retrieve" in k or "hit" in k), counters
    # the names kvops reads (smoke's MP_L1_WRITES / MP_LOOKUP_HITS, validate's GDS-073), as
    # this LMCache's own exporter publishes them
    metrics = parse_prometheus_text(_get(server.http_url + "/metrics"))
    read = {s.name: s.value for s in lmcache_server_counters(metrics, CHUNK)}
    assert read.get(LMCACHE_STORED, 0) >= STORED, (read, sorted(counters))
    assert read.get(LMCACHE_HIT, 0) >= STORED, (read, sorted(counters))
    assert (metrics.counter_value("lmcache_mp_l2_store_adapters", state="active") or 0) >= 1

    # Both processes restart: the server's L1 is empty, the files stay.
    mp.engine.stop()
    server.stop()
    marker = len(server.log_text().splitlines())
    server.start()
    mp.engine = mp.start_engine()
    mp.engine.wait_ready()
    third = greedy_completion(mp.engine.url, prompt)
    assert third["cached_tokens"] >= STORED, third
    assert same_answer(first, third), (first, third)
    after = "\n".join(server.log_text().splitlines()[marker:])
    l2_hits = [int(n) for n in re.findall(r"\(0 L1, (\d+) L2\)", after)]
    assert l2_hits and max(l2_hits) >= STORED // CHUNK, after[-3000:]

    assert _fallback_lines(server.log_text()) == []
    assert _fallback_lines(mp.engine.log_text()) == []


@pytest.mark.timing  # its exit status includes the TTFT drop, measured beside the lab's load
def test_kvops_smoke_reads_the_servers_counters_and_its_file_tier(
    mp: MpDeployment, kvops_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """After the restart above (the module's order): smoke's own fresh prompts."""
    server = mp.server
    assert mp.engine is not None
    assert server.proc is not None
    # kvops smoke reads LMCache's counters from the server (vLLM's /metrics has no lmcache:*)
    with ahead_of_the_lab_groups(), weighed_as_this_session(mp.engine.proc.pid, server.proc.pid):
        done = kvops_cli(
            "smoke",
            "--url",
            mp.engine.url,
            "--lmcache-server-url",
            server.http_url,
            "--gds-dir",
            str(mp.gds),
            "--prompt-tokens",
            "1600",
            "--json",
        )
    doc = json.loads(done.stdout)
    items = {item["name"]: item["status"] for item in doc["items"]}
    # the items first (the evidence after them is long): a failing one must show in the message
    assert done.returncode == 0 and items["stored_tokens"] == items["retrieved_tokens"] == "PASS", (
        json.dumps(doc["items"], indent=1) + done.stderr[-2000:]
    )
    # and counts the new objects of the server's file tier (the fs L2 adapter's *.data files)
    files_item = next(i for i in doc["items"] if i["name"] == "chunk_files")
    assert files_item["status"] == "PASS" and "fs L2 adapter" in files_item["message"], files_item
