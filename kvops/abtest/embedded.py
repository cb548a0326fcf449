"""Two embedded simulated engines (offload off and on, same profile) for runs with no --arm.

Why subprocesses: each engine is its own process like a real vLLM, so the client's timing
sees real HTTP and real scheduling, and an engine can be stopped (or killed) independently.
Each starts in its own process group and is stopped with SIGTERM then SIGKILL, also when the
run fails or is interrupted; its output goes to a log file in the run directory.
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
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvops.abtest.arms import Arm
from kvops.errors import KvopsError
from kvops.sim.lmcache_config import DEFAULT_GDS_BUFFER_MIB, gds_offload_keys
from kvops.sim.model import shared_kv_memory_bytes

OFFLOAD_CONFIG = json.dumps({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"})


@dataclass(frozen=True)
class SimProfile:
    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm-80gb"
    storage: str = "ontap-nfs-rdma-200g"
    time_scale: float = 0.1
    seed: int = 0
    # the offload engine's LMCache: GDS staging buffer (MiB of VRAM) and a CPU DRAM tier in
    # front of GDS (GB; 0 = none, as LMCache's GDS docs configure it)
    gds_buffer_mib: int = DEFAULT_GDS_BUFFER_MIB
    cpu_tier_gb: float = 0.0

    def kv_cache_memory_bytes(self) -> int:
        """The GPU KV memory both embedded engines get (`--kv-cache-memory-bytes`; see
        `kvops.sim.model.shared_kv_memory_bytes`). Without it the offload engine had fewer KV
        blocks than the baseline (its GDS buffer) and its smaller batches read as an offload
        effect (`make demo`: unique one-shot mean ITL "helps" -12%, nothing loaded)."""
        return shared_kv_memory_bytes(self.model, self.gpu, self.gds_buffer_mib)

    def offload_lmcache(self) -> dict[str, object]:
        """The offload engine's LMCache keys besides gds_path (written to its
        LMCACHE_CONFIG_FILE; `kvops.abtest.predict` builds the same engine from them)."""
        return gds_offload_keys(self.gds_buffer_mib, self.cpu_tier_gb)


class EngineStartError(KvopsError, RuntimeError):
    pass


def embedded_log(log_dir: Path, arm: str) -> Path:
    """Where an embedded engine writes its output (its service log)."""
    return log_dir / f"sim-{arm}.log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedEngines:
    """Context manager: `with EmbeddedEngines(run_dir, scale) as arms: ...`."""

    log_dir: Path
    kv_capacity_scale: float
    profile: SimProfile = field(default_factory=SimProfile)
    startup_timeout_s: float = 60.0
    # a new run starts with empty offload storage (the GDS path is never evicted and is read
    # back at start-up, so a previous run's chunks would turn "unique" prompts into hits);
    # --resume keeps it, as a restarted LMCache would
    fresh_storage: bool = True
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, port: int, offload: bool) -> list[str]:
        p = self.profile
        cmd = [
            sys.executable, "-m", "kvops", "sim", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--model", p.model, "--gpu", p.gpu, "--storage", p.storage,
            "--time-scale", f"{p.time_scale:g}", "--kv-capacity-scale",
            f"{self.kv_capacity_scale:g}", "--seed", str(p.seed),
        ]  # fmt: skip
        kv_bytes = p.kv_cache_memory_bytes()
        if kv_bytes > 0:  # 0: the weights leave no room; the engine says so itself
            cmd += ["--kv-cache-memory-bytes", str(kv_bytes)]
        if offload:
            cmd += ["--kv-transfer-config", OFFLOAD_CONFIG]
        return cmd

    def lmcache_config(self) -> Path:
        """The offload arm's LMCache config: GDS backend on a directory in the run folder; no
        CPU hot tier unless the profile asks for one (LMCache's GDS docs configure none), so
        reused prefixes really come from storage."""
        gds_dir = self.log_dir / "gds-offload"
        if self.fresh_storage and gds_dir.exists():
            shutil.rmtree(gds_dir)
        gds_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / "lmcache-offload.yaml"
        keys = {**self.profile.offload_lmcache(), "gds_path": str(gds_dir.resolve())}
        path.write_text(
            "# written by kvops ab-test for the embedded offload engine\n"
            + "".join(f"{k}: {json.dumps(v)}\n" for k, v in keys.items())
        )
        return path

    def start(self) -> list[Arm]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        arms: list[Arm] = []
        lmcache_file = self.lmcache_config()
        for name, offload in (("baseline", False), ("offload", True)):
            port = free_port()
            log = embedded_log(self.log_dir, name).open("wb")
            proc = subprocess.Popen(
                self.command(port, offload),
                stdout=log,
                stderr=subprocess.STDOUT,
                # A process group of their own (a terminal's Ctrl-C reaches kvops, which stops
                # them; stop() signals the group), but kvops's session: where the kernel groups
                # CPU time by session (autogroups, https://man7.org/linux/man-pages/man7/sched.7.html)
                # the engines and the client measuring them are then weighed as one job, as they
                # are by nice everywhere else, instead of the engines competing apart from it.
                process_group=0,
                env={
                    **os.environ,
                    "PYTHONHASHSEED": "0",
                    **({"LMCACHE_CONFIG_FILE": str(lmcache_file)} if offload else {}),
                },
            )
            log.close()
            self.procs.append(proc)
            arms.append(Arm(name, f"http://127.0.0.1:{port}"))
        for arm, proc in zip(arms, self.procs, strict=True):
            self._wait_ready(arm, proc)
        return arms

    def _wait_ready(self, arm: Arm, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineStartError(
                    f"embedded sim engine '{arm.name}' exited with code {proc.returncode}; "
                    f"see {self.log_dir / f'sim-{arm.name}.log'}"
                )
            try:
                with urllib.request.urlopen(arm.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise EngineStartError(
            f"embedded sim engine '{arm.name}' not ready after {self.startup_timeout_s:g} s"
        )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 5.0
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()

    def __enter__(self) -> list[Arm]:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
