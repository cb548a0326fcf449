"""Session fixtures for the real-engine tier: a CPU vLLM, a tiny local model, two engines.

Why: everything kvops measures must also hold against an engine nobody here wrote. These
fixtures install vLLM's CPU build into its own cached virtualenv (tests/engine/install_engine.sh),
build a seeded tiny Llama with a locally trained tokenizer (tests/engine/build_tiny_model.py),
and start two real `vllm serve` processes on 127.0.0.1:

- `baseline`: prefix caching on, KV cache capped to 40 blocks (5,120 tokens) so several long
  prefixes cannot all stay resident;
- `offload`: the same plus vLLM's ExampleConnector writing KV to a temporary directory — a real
  second cache tier through the interface LMCache plugs into.

Both are pinned to the same CPU (VLLM_CPU_OMP_THREADS_BIND) because a connector-enabled vLLM was
seen to take twice the threads of its baseline otherwise. Each runs in its own process group and
is stopped with its EngineCore/Worker children even when a test fails. If the engine cannot be
installed, the tier fails in CI (tests/ci_rule.py) and skips with the reason elsewhere.

Timings (install, model build, start) go to runs/engine/timings.json and the terminal summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ci_rule import unavailable

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUNS = REPO / "runs" / "engine"
CACHE = Path(os.environ.get("KVOPS_CACHE_DIR", str(Path.home() / ".cache" / "kvops")))
PIDFILE = RUNS / "engine-pgids.txt"

NUM_GPU_BLOCKS = 40  # x 128-token blocks = 5,120 tokens: four 1,920-token prefixes overflow it
BLOCK_TOKENS = 128
MAX_MODEL_LEN = 4096
OMP_BIND = os.environ.get("KVOPS_ENGINE_OMP_BIND", "0")
START_TIMEOUT_S = 420.0

TIMINGS: dict[str, float] = {}


def _record(name: str, seconds: float) -> None:
    TIMINGS[name] = round(seconds, 1)
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / "timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items())
        terminalreporter.write_line(f"engine tier timings: {parts}")


# The session's two engines while they run: stopped as soon as the engine tier is over (below)
# rather than at the end of the session, so idle vLLM processes do not share the two cores
# with the lab tier for its twenty minutes.
_RUNNING: dict[str, Engine] = {}


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last engine-tier test (this conftest's hooks see only this directory's
    items): stop the engines; the `engines` fixture's own teardown finds them stopped."""
    if not _RUNNING or (nextitem is not None and nextitem.path.parent == HERE):
        return
    for engine in _RUNNING.values():
        engine.stop()
    _RUNNING.clear()


def _unavailable(reason: str) -> None:
    """In CI the tier must never vanish quietly; locally a missing engine is a clear skip."""
    unavailable(f"engine tier unavailable: {reason}")


@pytest.fixture(scope="session")
def engine_venv() -> Path:
    """The cached virtualenv with vLLM's CPU build (installed on first use, ~3–8 min)."""
    RUNS.mkdir(parents=True, exist_ok=True)
    log = RUNS / "install.log"
    t0 = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run(
            ["bash", str(HERE / "install_engine.sh")], stdout=subprocess.PIPE, stderr=fh, text=True
        )
    _record("install_s", time.monotonic() - t0)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        _unavailable(f"install_engine.sh failed (exit {proc.returncode}): {' | '.join(tail)}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny_model(engine_venv: Path) -> Path:
    """The seeded tiny Llama, cached by a hash of its build script (rebuilt when it changes)."""
    import hashlib

    script = HERE / "build_tiny_model.py"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()[:12]
    target = CACHE / f"tiny-model-{digest}"
    if (target / "kvops-tiny-model.json").exists():
        return target
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="tiny-model-", dir=CACHE))
    proc = subprocess.run(
        [str(engine_venv / "bin" / "python"), str(script), str(tmp)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail(f"building the tiny model failed:\n{proc.stderr[-2000:]}", pytrace=False)
    try:
        tmp.rename(target)
    except OSError:  # another session built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    _record("model_build_s", time.monotonic() - t0)
    return target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _group_alive(pgid: int, leader: subprocess.Popen[bytes] | None) -> bool:
    if leader is not None:
        leader.poll()  # reap the leader, or its zombie keeps the group "alive"
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill_group(
    pgid: int, leader: subprocess.Popen[bytes] | None = None, grace_s: float = 20.0
) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(pgid, leader):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if leader is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            leader.wait(timeout=5)


def _reap_stale_engines() -> None:
    """Stop engine groups a previous run of this tier left behind (killed before teardown).
    Only groups recorded in our pid file whose leader is still a `vllm serve` are touched."""
    if not PIDFILE.exists():
        return
    for line in PIDFILE.read_text().split():
        pgid = int(line)
        try:
            cmd = Path(f"/proc/{pgid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"vllm" in cmd and b"serve" in cmd and b"tiny-model-" in cmd:
            _kill_group(pgid, None, grace_s=5.0)
    PIDFILE.unlink(missing_ok=True)


@dataclass
class Engine:
    """One running `vllm serve` (its own process group) and where to find its traces."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    kv_dir: Path | None = None
    started_s: float = 0.0
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        _kill_group(self.proc.pid, self.proc)


def launch_engine(
    name: str, venv: Path, model: Path, kv_dir: Path | None = None, extra: list[str] | None = None
) -> Engine:
    """Start `vllm serve` in its own process group; `wait_ready` blocks until /health is 200."""
    port = _free_port()
    args = [
        str(venv / "bin" / "vllm"),
        "serve",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "float32",
        "--num-gpu-blocks-override",
        str(NUM_GPU_BLOCKS),
        "--enforce-eager",
        *(extra or []),
    ]
    if kv_dir is not None:
        connector = {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(kv_dir)},
        }
        args += ["--kv-transfer-config", json.dumps(connector)]
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": OMP_BIND,
        "VLLM_SERVER_DEV_MODE": "1",  # serves POST /reset_prefix_cache
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONHASHSEED": "0",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    RUNS.mkdir(parents=True, exist_ok=True)
    log_path = RUNS / f"vllm-{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    with PIDFILE.open("a") as fh:
        fh.write(f"{proc.pid}\n")
    return Engine(name, port, proc, log_path, kv_dir, time.monotonic(), args)


def wait_ready(engine: Engine, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine.proc.poll() is not None:
            raise RuntimeError(
                f"vllm {engine.name} exited with {engine.proc.returncode} while starting:\n"
                f"{engine.log_tail()}"
            )
        if _healthy(engine.url):
            _record(f"start_{engine.name}_s", time.monotonic() - engine.started_s)
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"vllm {engine.name} not healthy after {timeout_s:.0f} s:\n{engine.log_tail()}"
    )


@pytest.fixture(scope="session")
def engines(
    engine_venv: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Engine]]:
    """Both arms, started together (their start-up is mostly single-threaded Python) and
    stopped together at the end of the session, whatever happened in between."""
    _reap_stale_engines()
    kv_dir = tmp_path_factory.mktemp("example-connector-kv")
    started: dict[str, Engine] = {}
    try:
        started["baseline"] = launch_engine("baseline", engine_venv, tiny_model)
        started["offload"] = launch_engine("offload", engine_venv, tiny_model, kv_dir=kv_dir)
        for engine in started.values():
            try:
                wait_ready(engine)
            except RuntimeError as exc:
                pytest.fail(str(exc), pytrace=False)
        _RUNNING.update(started)
        yield started
    finally:
        _RUNNING.clear()
        for engine in started.values():
            engine.stop()
        PIDFILE.unlink(missing_ok=True)
        shutil.rmtree(kv_dir, ignore_errors=True)  # ~2 MB of KV per prompt: hundreds of MB


@pytest.fixture(scope="session")
def baseline_engine(engines: dict[str, Engine]) -> Engine:
    return engines["baseline"]


@pytest.fixture(scope="session")
def offload_engine(engines: dict[str, Engine]) -> Engine:
    return engines["offload"]


def client_cpus() -> set[int]:
    """The CPUs the engines' compute threads are not bound to (all of them on a 1-CPU host).

    On this 2-core machine a client sharing the engines' compute CPU is descheduled while a
    forward pass runs: its event loop then lags by milliseconds, several chunks are stamped
    at once, and kvops rightly calls itself the bottleneck. An operator runs the load
    generator off the serving cores; the tests do the same."""
    available = os.sched_getaffinity(0)
    bound = {int(c) for part in OMP_BIND.split(",") for c in _cpu_range(part)}
    return (available - bound) or available


def _cpu_range(part: str) -> range:
    low, _, high = part.partition("-")
    return range(int(low), int(high or low) + 1)


def _run_kvops(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """Run the kvops CLI as a user would (same interpreter as the tests), off the engines'
    compute CPU."""
    cpus = client_cpus()
    return subprocess.run(
        [sys.executable, "-m", "kvops", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        preexec_fn=lambda: os.sched_setaffinity(0, cpus),
    )


@pytest.fixture(scope="session")
def kvops_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return _run_kvops
