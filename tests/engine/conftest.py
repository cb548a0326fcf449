"""Session fixtures for the real-engine tier: a CPU vLLM, the real LMCache, a tiny local model.

Why: everything kvops measures must also hold against an engine nobody here wrote, and the
offload it deploys must be the one that runs. These fixtures install vLLM's CPU build and the
LMCache version the vllm_lmcache role pins into their own cached virtualenv
(tests/engine/install_engine.sh), build a seeded tiny Llama with a locally trained tokenizer
(tests/engine/build_tiny_model.py), and start two real `vllm serve` processes on 127.0.0.1 whose
command line, environment and LMCache YAML are rendered by Ansible's templar from the role's
own defaults, vars and templates (`render_role`), as a play would render them:

- `baseline`: the role's `baseline` variant (prefix caching only);
- `offload`: the role's `offload` variant: LMCache through the role's connector JSON, its GDS
  backend on a temporary `gds_path`. The only stand-in is LMCache's device seam
  (tests/engine/lmcache_device_seam_double.py, a test double loaded through the engine venv's
  .pth file only when KVOPS_TEST_LMCACHE_DEVICE_SEAM names it).

Both run with the tier's CPU arguments (`CPU_ARGS`): KV cache capped to 40 blocks (5,120 tokens)
so several long prefixes cannot all stay resident, float32, eager mode.

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
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from ci_rule import unavailable
from role_files import role_vars_file

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

ROLE = REPO / "roles" / "vllm_lmcache"
SEAM_DOUBLE = HERE / "lmcache_device_seam_double.py"
# The tier's additions to the role's command line (vllm_lmcache_extra_args): what a CPU vLLM on
# two cores needs, and the prefix-cache/usage features the tests read.
CPU_ARGS = [
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
    "--dtype",
    "float32",
    "--num-gpu-blocks-override",
    str(NUM_GPU_BLOCKS),
    "--enforce-eager",
]
# Role variables the tier sets, beyond paths and ports: sizes for a 2-core, few-GB test host (the
# defaults are an 8 GiB GDS buffer and 5 GB of CPU staging per rank), and `use_gds: false`
# through the role's own override (vllm_lmcache_config): cuFile is a device API; LMCache's POSIX
# fallback is the same backend's code path without it.
ROLE_TEST_VARS: dict[str, object] = {
    "vllm_lmcache_gds_buffer_mib": 256,
    "vllm_lmcache_staging_cpu_gb_per_rank": 0.5,
    "vllm_lmcache_config": {"use_gds": False},
    "vllm_lmcache_dev_mode": True,  # VLLM_SERVER_DEV_MODE=1: POST /reset_prefix_cache
}


_RECORDING = threading.Lock()  # the prestart's thread records its engines' start times too


def _record(name: str, seconds: float) -> None:
    with _RECORDING:
        TIMINGS[name] = round(seconds, 1)
        RUNS.mkdir(parents=True, exist_ok=True)
        (RUNS / "timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


NOTES: list[str] = []


def _record_note(note: str) -> None:
    NOTES.append(note[:500])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items())
        terminalreporter.write_line(f"engine tier timings: {parts}")
    for note in NOTES:
        terminalreporter.write_line(note)


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


def tiny_model_path() -> Path:
    """Where the seeded tiny Llama is cached: by a hash of its build script."""
    import hashlib

    digest = hashlib.sha256((HERE / "build_tiny_model.py").read_bytes()).hexdigest()[:12]
    return CACHE / f"tiny-model-{digest}"


def build_tiny_model(venv: Path) -> Path:
    """The cached tiny model, built with the engine venv's Python if missing; raises
    RuntimeError with the build's errors."""
    target = tiny_model_path()
    if (target / "kvops-tiny-model.json").exists():
        return target
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="tiny-model-", dir=CACHE))
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(HERE / "build_tiny_model.py"), str(tmp)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(proc.stderr[-2000:])
    try:
        tmp.rename(target)
    except OSError:  # another session (or the prestart) built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    _record("model_build_s", time.monotonic() - t0)
    return target


@pytest.fixture(scope="session")
def tiny_model(engine_venv: Path) -> Path:
    """The seeded tiny Llama, cached by a hash of its build script (rebuilt when it changes)."""
    try:
        return build_tiny_model(engine_venv)
    except RuntimeError as exc:
        pytest.fail(f"building the tiny model failed:\n{exc}", pytrace=False)


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
class RoleRendering:
    """What roles/vllm_lmcache would deploy for one variant: the service's command line, its
    environment file and (offload variants) the LMCache YAML, rendered from the role's files."""

    variant: str
    argv: list[str]
    env: dict[str, str]
    lmcache_yaml: str | None
    variables: dict[str, object]


def render_role(variant: str, **role_vars: object) -> RoleRendering:
    """Render the vllm_lmcache role's own expressions with Ansible's templar, as a play does:
    ExecStart (`_vllm_lmcache_exec_start`), templates/service.env.j2 and the `content` of the
    task that writes lmcache.yaml (tasks/present.yml). A changed default, template or vars
    expression in the role changes what the engine tier runs."""
    import shlex

    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables: dict[str, object] = {}
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
        variables.update(role_vars_file(path))
    variables.update(ROLE_TEST_VARS)
    variables.update(role_vars)
    variables.update(
        vllm_lmcache_variant=variant,
        ansible_facts={"os_family": "Debian"},
        ansible_managed="rendered by the kvops engine tier (tests/engine/conftest.py)",
    )
    templar = Templar(loader=DataLoader(), variables=variables)

    def render(text: str) -> object:
        return templar.template(trust_as_template(text))

    tasks = yaml.safe_load((ROLE / "tasks" / "present.yml").read_text())

    def task(name: str) -> dict[str, Any]:
        (found,) = [t for t in tasks if t.get("name") == f"present | {name}"]
        return dict(found)

    argv = shlex.split(str(render("{{ _vllm_lmcache_exec_start }}")))
    env: dict[str, str] = {}
    # both environment files, each with its task's own vars, as systemd reads them both
    for name in ("Write the environment file", "Write the secret environment file"):
        template = Templar(
            loader=DataLoader(),
            variables={**variables, **{k: render(v) for k, v in task(name)["vars"].items()}},
        )
        text = str(
            template.template(
                trust_as_template((ROLE / "templates" / "service.env.j2").read_text())
            )
        )
        env.update(
            line.split("=", 1)
            for line in text.splitlines()
            if line.strip() and not line.startswith("#")
        )
    lmcache_yaml = None
    if render("{{ _vllm_lmcache_offload }}") is True:
        copy = task("Write the LMCache configuration")["ansible.builtin.copy"]
        content = copy["content"]
        lmcache_yaml = str(render(content))
    return RoleRendering(variant, argv, env, lmcache_yaml, variables)


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
    env: dict[str, str] = field(default_factory=dict)
    role: RoleRendering | None = None
    ready: bool = False  # /health answered once: its start time is recorded

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        _kill_group(self.proc.pid, self.proc)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        wait_ready(self, timeout_s)


@dataclass
class Launch:
    """Everything `vllm serve` needs, rendered and written, not started yet (`start`)."""

    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    kv_dir: Path | None
    role: RoleRendering


def launch_engine(*args: Any, **kwargs: Any) -> Engine:
    """`plan_launch(*args, **kwargs)`, started: the role's `variant` as `vllm serve` in its own
    process group, its config files under `root` (etc/, home/, gds/); `wait_ready` blocks until
    /health is 200."""
    return start(plan_launch(*args, **kwargs))


def plan_launch(
    name: str,
    venv: Path,
    model: Path,
    variant: str,
    root: Path,
    *,
    seam: bool = True,
    gds_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    role_vars: dict[str, object] | None = None,
) -> Launch:
    """The role's `variant` rendered (Ansible's templar: call it from the main thread) and its
    files written under `root`, on a free port.

    `seam`: load LMCache's device-seam test double (offload variants; False shows what LMCache
    does on this host without it). `gds_dir`: another engine's gds_path (cross-process reuse).
    `extra_env` goes over everything (negative controls). `role_vars`: more role variables
    (offload_mp: its server's ports)."""
    port = _free_port()
    gds = gds_dir or root / "gds"
    role = render_role(
        variant,
        vllm_lmcache_model=str(model),
        vllm_lmcache_served_model_name="tiny",
        vllm_lmcache_listen_address="127.0.0.1",
        vllm_lmcache_port=port,
        vllm_lmcache_max_model_len=MAX_MODEL_LEN,
        vllm_lmcache_venv_path=str(venv),
        vllm_lmcache_config_dir=str(root / "etc"),
        vllm_lmcache_service_home=str(root / "home"),
        vllm_lmcache_gds_dir=str(gds),
        vllm_lmcache_extra_args=CPU_ARGS,
        **(role_vars or {}),
    )
    # What the role's tasks create before the start: the config directory and its files, the
    # service home with the Prometheus multiprocess directory (emptied at each start), the GDS
    # directory (nfs_rdma_mount's job on a real host).
    (root / "etc").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(role.env["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
    Path(role.env["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True)
    kv_dir = None
    if role.lmcache_yaml is not None:
        Path(role.env["LMCACHE_CONFIG_FILE"]).write_text(role.lmcache_yaml)
        kv_dir = gds
        kv_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": OMP_BIND,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **role.env,
    }
    env.pop("KVOPS_TEST_LMCACHE_DEVICE_SEAM", None)
    env.pop("KVOPS_TEST_LMCACHE_SEAM_CORRUPT", None)
    if seam and role.lmcache_yaml is not None:
        env["KVOPS_TEST_LMCACHE_DEVICE_SEAM"] = str(SEAM_DOUBLE)
    env.update(extra_env or {})
    RUNS.mkdir(parents=True, exist_ok=True)
    return Launch(name, port, role.argv, env, RUNS / f"vllm-{name}.log", kv_dir, role)


def start(launch: Launch) -> Engine:
    """`vllm serve` as planned, in its own process group (recorded in PIDFILE)."""
    with launch.log_path.open("wb") as log:
        proc = subprocess.Popen(
            launch.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=launch.env,
            start_new_session=True,
        )
    with PIDFILE.open("a") as fh:
        fh.write(f"{proc.pid}\n")
    return Engine(
        launch.name, launch.port, proc, launch.log_path, launch.kv_dir, time.monotonic(),
        launch.argv, launch.env, launch.role,
    )  # fmt: skip


def wait_ready(
    engine: Engine, timeout_s: float = START_TIMEOUT_S, stop: threading.Event | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        if engine.proc.poll() is not None:
            raise RuntimeError(
                f"vllm {engine.name} exited with {engine.proc.returncode} while starting:\n"
                f"{engine.log_tail()}"
            )
        if _healthy(engine.url):
            if not engine.ready:
                _record(f"start_{engine.name}_s", time.monotonic() - engine.started_s)
                engine.ready = True
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"vllm {engine.name} not healthy after {timeout_s:.0f} s:\n{engine.log_tail()}"
    )


ARMS = ("baseline", "offload")


class Prestart:
    """The session's two engines, started in the background while the tests before this tier
    run (from the test pytest_collection_finish names): a vLLM start is a minute or two of
    imports in three processes, on the critical path of the group this tier runs in
    (tests/tiers.py), and an engine that is up sits idle (vLLM's readers stop spinning a second
    after their last work). The role is rendered in the main thread (Ansible's templar is not
    for threads); the thread waits for the engine venv (install_engine.sh, locked against
    tests/tiers.py's own preparation) and the tiny model, then starts both and waits for
    /health. The `engines` fixture takes them; whatever went wrong here, that fixture meets
    again and reports as it always did."""

    def __init__(self, venv: Path, root: Path, launches: list[Launch]) -> None:
        self.venv, self.root, self.launches = venv, root, launches
        self.engines: dict[str, Engine] = {}
        self.error: str | None = None
        self.stopping = threading.Event()
        self._starting = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="engine-prestart", daemon=True)

    def begin(self) -> None:
        if not self.thread.is_alive() and not self.stopping.is_set():
            self.thread.start()

    def _run(self) -> None:
        try:
            with (RUNS / "prestart-install.log").open("w") as log:
                proc = subprocess.run(
                    ["bash", str(HERE / "install_engine.sh")],
                    stdout=subprocess.PIPE, stderr=log, text=True,
                )  # fmt: skip
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines or Path(lines[-1]) != self.venv:
                raise RuntimeError(f"install_engine.sh: exit {proc.returncode}, {lines[-1:]}")
            build_tiny_model(self.venv)
            with self._starting:
                if self.stopping.is_set():
                    return
                self.engines = {launch.name: start(launch) for launch in self.launches}
            for engine in self.engines.values():
                wait_ready(engine, stop=self.stopping)
        except Exception as exc:  # any failure: the fixture starts them itself and reports
            self.error = f"{type(exc).__name__}: {exc}"
            self.stop()

    def take(self) -> dict[str, Engine]:
        """Both engines, healthy; {} (all stopped) if the prestart did not get there."""
        if self.thread.ident is None:  # never begun (its trigger test did not run)
            self.stop()
            return {}
        self.thread.join()
        if self.error is not None or set(self.engines) != set(ARMS):
            _record_note(f"engine prestart: {self.error or 'stopped'}; started by the fixture")
            self.stop()
            return {}
        return self.engines

    def stop(self) -> None:
        self.stopping.set()
        with self._starting:  # nothing starts after this
            for engine in self.engines.values():
                engine.stop()


_PRESTART: list[Prestart] = []


@dataclass(eq=False)  # hashable: pluggy keeps its plugins in sets
class BeginBefore:
    """A plugin (registered, so it sees every test, not only this directory's) that begins the
    prestart when the test ``nodeid`` starts."""

    nodeid: str
    prestart: Prestart

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item.nodeid == self.nodeid:
            self.prestart.begin()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Prestart the session's engines when a selected test will use them: from the test after
    the last one before this tier whose verdict rests on timings (``timing``: the load
    generator's accuracy, the embedded engines' agreement, the A/A), so that no such
    measurement shares the CPU with two vLLMs starting."""
    items = session.items
    if session.config.option.collectonly or _PRESTART:
        return
    if not any("engines" in getattr(item, "fixturenames", ()) for item in items):
        return
    first_here = next(i for i, item in enumerate(items) if item.path.is_relative_to(HERE))
    timed = [i for i, item in enumerate(items[:first_here]) if item.get_closest_marker("timing")]
    _reap_stale_engines()
    venv = Path(os.environ.get("KVOPS_ENGINE_VENV", str(CACHE / "engine-venv")))
    root = Path(tempfile.mkdtemp(prefix="kvops-engines-"))
    launches = [plan_launch(arm, venv, tiny_model_path(), arm, root / arm) for arm in ARMS]
    prestart = Prestart(venv, root, launches)
    _PRESTART.append(prestart)
    trigger = items[timed[-1] + 1 if timed else 0].nodeid
    session.config.pluginmanager.register(BeginBefore(trigger, prestart), "kvops-engine-prestart")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Prestarted engines no test took (an interrupted session) are stopped."""
    while _PRESTART:
        prestart = _PRESTART.pop()
        prestart.stop()
        shutil.rmtree(prestart.root, ignore_errors=True)


@pytest.fixture(scope="session")
def engines(
    engine_venv: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Engine]]:
    """Both arms, started together (their start-up is mostly single-threaded Python) and
    stopped together at the end of the session, whatever happened in between: the prestarted
    pair if it got up, else started here."""
    prestart = _PRESTART.pop() if _PRESTART else None
    started: dict[str, Engine] = prestart.take() if prestart is not None else {}
    if started and prestart is not None:
        root = prestart.root
    else:
        if prestart is not None:
            shutil.rmtree(prestart.root, ignore_errors=True)
        _reap_stale_engines()
        root = tmp_path_factory.mktemp("engines")
    try:
        for arm in ARMS:
            if arm not in started:
                started[arm] = launch_engine(arm, engine_venv, tiny_model, arm, root / arm)
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
        shutil.rmtree(root, ignore_errors=True)  # LMCache's chunk files: hundreds of MB


@pytest.fixture(scope="session")
def engine_launcher() -> Callable[..., Engine]:
    """`launch_engine`, for tests that start engines of their own (stopped by them)."""
    return launch_engine


@pytest.fixture(scope="session")
def role_renderer() -> Callable[..., RoleRendering]:
    """`render_role`, for tests that render the role themselves (a fixture: in a whole-suite
    run the module named `conftest` is tests/conftest.py, so `from conftest import` fails)."""
    return render_role


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
