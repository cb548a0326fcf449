"""What the probe may not do on a host: run the service's code, hand tools the service's
environment, write where a link points, leak secrets, or hang on a dead storage path.

Tools here are test doubles written into tmp_path (shell scripts that report what they saw).
"""

from __future__ import annotations

import http.server
import json
import os
import pwd
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvops import evidence as ev
from kvops.probe import storage
from kvops.probe.core import Probe, in_child
from kvops.probe.main import collect
from kvops.probe.redact import REDACTED, redact_argv, redact_env, redact_text, redact_value
from kvops.probe.service import collect_lmcache_version
from kvops.validate.judge import EvidenceError, load_evidence, save_evidence

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch users")


# --- the redactor ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("ExecStart=/opt/vllm/bin/vllm serve m --api-key sk-live-123 --port 8000", "sk-live-123"),
        ("ExecStart=/opt/vllm/bin/vllm serve m --api-key=sk-live-123", "sk-live-123"),
        ("api_key: hunter2\nchunk_size: 256\n", "hunter2"),
        ("remote_url: redis://admin:hunter2@cache:6379\n", "admin:hunter2"),
        ("Environment=HTTPS_PROXY=http://u:pw@proxy:3128 LC_ALL=C", "u:pw"),
        ("LMCACHE_REMOTE_URL=redis://u:pw@cache:6379", "u:pw"),
        ("Environment=REDIS_PASS=s3cret", "s3cret"),
        ("Environment=DATABASE_URL=postgres://app:pw@db/x", "app:pw"),
        ("Environment=DATABASE_URL=sqlite:///x.db", "sqlite:///x.db"),
        ('{"kv_connector":"X","kv_connector_extra_config":{"api_key":"k-9"}}', "k-9"),
        ("Environment=HF_TOKEN='hf_abc def'", "hf_abc"),
    ],
)
def test_redactor_hides_each_secret_form(text: str, secret: str) -> None:
    out = redact_text(text)
    assert secret not in out and REDACTED in out
    assert redact_text(out) == out  # idempotent: redacting twice changes nothing


@pytest.mark.parametrize(
    ("text", "secrets"),
    [
        # vLLM's own start-up line (`non-default args: {...}`), --api-key as a list and a str
        (
            "INFO 12-04 non-default args: {'model': 'm', 'api_key': ['sk-aa1', 'sk-bb2']}",
            ["sk-aa1", "sk-bb2"],
        ),
        ("INFO 12-04 args: Namespace(model='m', api_key='sk-cc3', port=8000)", ["sk-cc3"]),
        ("INFO 12-04 non-default args: {'api_key': 'sk-dd4', 'port': 8000}", ["sk-dd4"]),
        ('{"api_key": ["sk-ee5", "sk-ff6"], "port": 8000}', ["sk-ee5", "sk-ff6"]),
        # HTTP authorization, any case, as a header line or a curl argument
        ("Authorization: Bearer tok-gg7", ["tok-gg7"]),
        ("authorization: bearer tok-hh8", ["tok-hh8"]),
        ('curl -H "AUTHORIZATION: Bearer tok-ii9" http://h/v1/models', ["tok-ii9"]),
        ("proxy_authorization=Basic dXNlcjpwYXNz", ["dXNlcjpwYXNz"]),
        ("GET /v1/models 401 (header Bearer tok-jj0 rejected)", ["tok-jj0"]),
        # YAML values written as a block or a list
        ("api_key:\n  - sk-kk1\n  - sk-ll2\nchunk_size: 256\n", ["sk-kk1", "sk-ll2"]),
        ("api_key:\n- sk-mm3\nchunk_size: 256\n", ["sk-mm3"]),
        ("hf_token: |\n  abc-nn4\n  def-oo5\nchunk_size: 256\n", ["abc-nn4", "def-oo5"]),
        ("extra_config:\n  remote_auth_token: >-\n    pp6-folded\n  x: 1\n", ["pp6-folded"]),
        ("api_key: [sk-qq7, sk-rr8]\n", ["sk-qq7", "sk-rr8"]),
        ('{\n  "api_key": [\n    "sk-ss9"\n  ],\n  "port": 1\n}', ["sk-ss9"]),
        ('{\n  "auth": {\n    "user": "u-tt0"\n  }\n}', ["u-tt0"]),
    ],
)
def test_redactor_hides_vllm_bearer_and_yaml_block_forms(text: str, secrets: list[str]) -> None:
    out = redact_text(text)
    assert REDACTED in out
    for secret in secrets:
        assert secret not in out, out
    assert redact_text(out) == out


def test_redactor_keeps_what_follows_a_yaml_secret_block() -> None:
    text = "api_key:\n  - sk-1\nchunk_size: 256\nlocal_cpu: false\n"
    out = redact_text(text)
    assert out.endswith("chunk_size: 256\nlocal_cpu: false\n") and "api_key:" in out


def test_redactor_keeps_ordinary_settings_readable() -> None:
    text = "--max-num-batched-tokens 8192 --tokenizer /m iommu=pt chunk_size: 256 passthrough=1"
    assert redact_text(text) == text


def test_redact_value_keeps_the_shape_and_hides_secrets() -> None:
    config = {
        "chunk_size": 256,
        "remote_url": "redis://admin:hunter2@cache:6379",
        "extra_config": {"api_key": {"nested": "k-9"}, "disk_io_threads": 4},
        "exec_start": ["vllm", "serve", "m --api-key sk-1"],
        "local_cpu": False,
    }
    out = redact_value(config)
    assert out["chunk_size"] == 256 and out["local_cpu"] is False
    assert out["remote_url"] == f"redis://{REDACTED}@cache:6379"
    assert out["extra_config"] == {"api_key": REDACTED, "disk_io_threads": 4}
    assert "sk-1" not in out["exec_start"][2]
    assert redact_value(out) == out


def test_redact_env_and_argv() -> None:
    env = redact_env({"REDIS_PASS": "x", "PROXY": "http://u:p@h:1", "PATH": "/usr/bin"})
    assert env == {"REDIS_PASS": REDACTED, "PROXY": f"http://{REDACTED}@h:1", "PATH": "/usr/bin"}
    kv = json.dumps({"kv_connector": "LMCacheConnectorV1", "api_key": "k-1"})
    argv = redact_argv(["vllm", "serve", "--api-key", "sk", "--kv-transfer-config", kv])
    assert argv[3] == REDACTED and "k-1" not in argv[5]
    assert json.loads(argv[5])["kv_connector"] == "LMCacheConnectorV1"


# --- versions are read, never executed -----------------------------------------------------
def test_lmcache_version_comes_from_metadata_without_running_the_service_python(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    marker = tmp_path / "executed"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python3"
    python.write_text(f"#!/bin/sh\ntouch {marker}\necho 9.9.9\n")
    python.chmod(0o755)
    info = venv / "lib" / "python3.11" / "site-packages" / "lmcache-0.5.6.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lmcache\nVersion: 0.5.6\n\nx\n")
    (info.parent / "evil.pth").write_text(f"import os; os.system('touch {marker}')\n")
    probe = Probe({})
    collect_lmcache_version(probe, [str(python), "-m", "vllm"], {}, {}, 0)
    item = probe.items[ev.LMCACHE_VERSION]
    assert item["source"] == str(info / "METADATA")
    assert item["stdout"] == "Name: lmcache\nVersion: 0.5.6\n"
    assert not marker.exists()


def test_missing_lmcache_says_where_it_looked(tmp_path: Path) -> None:
    probe = Probe({})
    collect_lmcache_version(probe, [str(tmp_path / "bin" / "python3")], {}, {}, 0)
    item = probe.items[ev.LMCACHE_VERSION]
    assert item["error"].startswith("ENOENT") and str(tmp_path) in item["error"]


# --- tools: clean environment, explicit config, private log/working directory --------------
def _tool(directory: Path, name: str, body: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_tools_get_a_clean_env_and_a_private_dir_removed_afterwards(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    _tool(tools, "gdscheck", 'echo "cwd=$(pwd)"; env; echo log > cufile.log\n')
    evil = tmp_path / "evil.json"
    evil.write_text("{}")
    evil.chmod(0o666)  # anyone may write it: root must not read it on the service's word
    probe = Probe({"tool_dirs": [str(tools)]})
    service_env = {"CUFILE_ENV_PATH_JSON": str(evil), "CUFILE_LOGFILE_PATH": "/tmp/clobber"}
    os.environ["KVOPS_TEST_SECRET_IN_PROBE_ENV"] = "leak"
    try:
        storage.collect_gds(probe, {}, {"env": service_env})
    finally:
        del os.environ["KVOPS_TEST_SECRET_IN_PROBE_ENV"]
    workdir = probe.workdir()
    probe.close()
    out = probe.items[ev.GDSCHECK]["stdout"]
    assert "KVOPS_TEST_SECRET_IN_PROBE_ENV" not in out and "/tmp/clobber" not in out
    assert "CUFILE_ENV_PATH_JSON=/etc/cufile.json" in out
    assert f"CUFILE_LOGFILE_PATH={workdir}/cufile.log" in out and f"cwd={workdir}" in out
    assert not Path(workdir).exists() and not Path("cufile.log").exists()
    assert "not read" in probe.items[ev.CUFILE_JSON]["note"]


# --- the storage bench -----------------------------------------------------------------------
@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="kvops-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@ROOT_ONLY
def test_bench_never_follows_a_planted_link_runs_as_the_service_user_and_cleans_up(
    shared_dir: Path,
) -> None:
    tmp_path = shared_dir
    gds = tmp_path / "gds"
    gds.mkdir()
    gds.chmod(0o777)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (gds / "kvops-gdsio").symlink_to(elsewhere)  # planted by someone with access to the dir
    stale = gds / "kvops-gdsio-old123"
    stale.mkdir()
    (stale / "file").write_text("left by a killed run")
    nobody = pwd.getpwnam("nobody")
    for path in (stale, stale / "file"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)  # made by the bench user that run
    left_s = time.time() - storage.STALE_BENCH_AGE_S - 60  # untouched since: no bench in progress
    os.utime(stale, (left_s, left_s))
    tools = tmp_path / "tools"
    _tool(tools, "gdsio", 'echo "user=$(id -un) cwd=$(pwd)"; touch "$2/written"\n')
    probe = Probe({"tool_dirs": [str(tools)]})
    settings = {"gds_dir": str(gds), "storage_bench": True}
    storage.bench(probe, settings, "/etc/cufile.json", "nobody")
    probe.close()
    write = probe.items[ev.GDSIO_WRITE]
    target = write["source"][write["source"].index("-D") + 1]
    assert "user=nobody" in write["stdout"] and write["run_as"] == "nobody"
    assert Path(target).parent == gds and Path(target).name.startswith("kvops-gdsio-")
    assert probe.items[ev.BENCH_DIR]["data"]["stale_removed"] == [str(stale)]
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert sorted(p.name for p in gds.iterdir()) == ["kvops-gdsio"]  # only the link remains


def test_bench_not_run_when_its_directory_cannot_be_made(tmp_path: Path) -> None:
    probe = Probe({})
    settings = {"gds_dir": str(tmp_path / "missing"), "storage_bench": True}
    storage.bench(probe, settings, "/etc/cufile.json", None)
    assert probe.items[ev.BENCH_DIR]["error"].startswith("bench directory:")
    assert probe.items[ev.GDSIO_WRITE]["error"].startswith("not run: bench directory")


# --- a storage path that stops answering ---------------------------------------------------
def _hang(*_args: Any) -> dict[str, Any]:
    time.sleep(60)
    return {}


def test_in_child_gives_up_on_a_call_that_hangs() -> None:
    result, error = in_child(lambda: _hang(), 0.3)
    assert result is None and error == "did not answer in 0.3 s"
    assert in_child(lambda: {"ok": 1}, 5) == ({"ok": 1}, None)
    result, error = in_child(lambda: 1 / 0, 5)
    assert result is None and "ZeroDivisionError" in str(error)


def test_hung_gds_dir_still_gives_platform_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "summarize_dir", _hang)  # the forked child inherits it
    config = {
        "command_timeout_s": 0.5,
        "deadline_s": 30,
        "settings": {"gds_dir": str(tmp_path), "vllm_url": "http://127.0.0.1:9"},
    }
    doc = collect(config)
    item = doc["items"][ev.GDS_DIR]
    assert item["error"] == f"GDS directory {tmp_path} did not answer in 0.5 s"
    assert item["data"]["exists"] is None
    assert doc["items"][ev.MOUNTS]["error"] is None  # the platform evidence is all there
    assert ev.HTTP_METRICS in doc["items"]


# --- saved evidence ------------------------------------------------------------------------
def test_saved_evidence_is_private_and_a_host_twice_is_an_error(tmp_path: Path) -> None:
    bundle = tmp_path / "ev"
    (paths,) = [save_evidence(bundle, [{"host": "gpu-1", "items": {}}])]
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o700
    assert stat.S_IMODE(paths[0].stat().st_mode) == 0o600
    (bundle / "copy.json").write_text(json.dumps({"host": "gpu-1", "items": {}}))
    with pytest.raises(EvidenceError, match="host 'gpu-1' already read from"):
        load_evidence(bundle)
    with pytest.raises(EvidenceError, match="map to it"):
        save_evidence(tmp_path / "b", [{"host": "a/b"}, {"host": "a_b"}])


def test_saving_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    bundle = tmp_path / "ev"
    bundle.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (bundle / "gpu-1.json").symlink_to(victim)
    with pytest.raises(EvidenceError, match="cannot write"):
        save_evidence(bundle, [{"host": "gpu-1"}])
    assert victim.read_text() == "keep"


def test_nobody_exists_for_the_user_switch_tests() -> None:
    assert pwd.getpwnam("nobody").pw_uid != 0


def test_gds_dir_and_lmcache_gds_paths_are_resolved_in_the_child(tmp_path: Path) -> None:
    real = tmp_path / "nfs" / "kv"
    real.mkdir(parents=True)
    link = tmp_path / "kv"
    link.symlink_to(real)
    probe = Probe({})
    probe.items["lmcache_config"] = {"stdout": f"chunk_size: 256\ngds_path: '{link}'  # link\n"}
    storage.gds_dir(probe, str(link), None, {"LMCACHE_GDS_PATH": f"{link},relative"})
    resolved = probe.items[ev.GDS_DIR]["data"]["resolved_paths"]
    assert resolved == {str(link): str(real)}


def test_launch_files_are_read_as_text_never_run(tmp_path: Path) -> None:
    from kvops.probe.service import collect_launch_files

    marker = tmp_path / "ran"
    script = tmp_path / "run-vllm.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexec vllm serve m --api-key sk-1\n")
    script.chmod(0o755)
    config = tmp_path / "serve.yaml"
    config.write_text("api-key: sk-2\nkv-transfer-config: '{}'\n")
    probe = Probe({})
    collect_launch_files(probe, [["/bin/bash", str(script)], ["vllm", "--config", str(config)]], 0)
    assert "sk-1" not in probe.items[ev.VLLM_WRAPPER]["stdout"]
    assert "kv-transfer-config" in probe.items[ev.VLLM_CONFIG_FILE]["stdout"]
    assert "sk-2" not in probe.items[ev.VLLM_CONFIG_FILE]["stdout"]
    assert not marker.exists()


class _AuthHandler(http.server.BaseHTTPRequestHandler):
    """Answers like vLLM started with --api-key: /v1/* only with the bearer token."""

    def do_GET(self) -> None:
        ok = not self.path.startswith("/v1/") or (
            self.headers.get("Authorization") == "Bearer tok-123"
        )
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b'{"data": []}' if ok else b'{"error": "Unauthorized"}')

    def log_message(self, *args: Any) -> None:
        pass


def test_vllm_behind_api_key_gets_the_token_which_is_never_recorded() -> None:
    from kvops.remote.inventory import InventoryHost, probe_options, probe_settings

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AuthHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        host = InventoryHost("gpu-1", vars={"kvops_vllm_url": url, "kvops_vllm_api_key": "tok-123"})
        options = probe_options(host)
        assert options["http_bearer_token"] == "tok-123"
        config = {**options, "settings": probe_settings(host), "deadline_s": 30}
        doc = collect(config)
        assert doc["items"][ev.HTTP_MODELS]["http_status"] == 200
        assert "tok-123" not in json.dumps(doc)
        del config["http_bearer_token"]
        assert collect(config)["items"][ev.HTTP_MODELS]["http_status"] == 401
    finally:
        server.shutdown()


@ROOT_ONLY
def test_files_the_service_names_are_read_only_if_the_service_could(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash:19000::::::\n")
    secret.chmod(0o600)  # root only
    probe = Probe({})
    item = probe.file("lmcache_config", str(secret), readable_by="nobody")
    assert "not readable by the service user nobody" in item["error"]
    assert "stdout" not in item
    secret.chmod(0o644)
    assert probe.file("lmcache_config", str(secret), readable_by="nobody")["error"] is None


def test_an_unprivileged_probe_says_who_really_ran_the_bench(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvops.probe import core

    monkeypatch.setattr(core.os, "geteuid", lambda: pwd.getpwnam("nobody").pw_uid)
    assert core._effective_user("vllm") == "nobody (not vllm: the probe is not root)"
    assert core._effective_user("nobody") == "nobody"
    assert core.privilege_drop("vllm" if _has_user("vllm") else "root") is None


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Another origin: records every Authorization header that reaches it."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append(self.headers.get("Authorization") or "")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    def log_message(self, *args: Any) -> None:
        pass


def _redirecting_handler(elsewhere: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Redirecting(http.server.BaseHTTPRequestHandler):
        """A hostile listener on the vLLM port: /v1/models goes to another origin, /metrics to
        /metrics/ on itself (as vLLM's mounted metrics app does), which needs the token."""

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self.send_response(302)
                self.send_header("Location", elsewhere + "/steal")
                self.end_headers()
            elif self.path == "/metrics":
                self.send_response(307)
                self.send_header("Location", "/metrics/")
                self.end_headers()
            else:
                ok = self.headers.get("Authorization") == "Bearer tok-123"
                self.send_response(200 if ok else 401)
                self.end_headers()
                self.wfile.write(b"vllm:num_requests_running 0\n")

        def log_message(self, *args: Any) -> None:
            pass

    return Redirecting


def test_the_api_key_never_follows_a_redirect_to_another_origin() -> None:
    from kvops.probe.core import Probe as ProbeCore

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    elsewhere = f"http://127.0.0.1:{other.server_address[1]}"
    vllm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _redirecting_handler(elsewhere))
    servers = [other, vllm]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{vllm.server_address[1]}"
        probe = ProbeCore({"http_bearer_token": "tok-123"})
        models = probe.http("models", base + "/v1/models")
        assert _Recorder.seen == []  # nothing, token or not, reached the other origin
        assert models["http_status"] == 302
        assert "redirect to another origin not followed" in models["error"]
        metrics = probe.http("metrics", base + "/metrics")
        assert metrics["http_status"] == 200  # same origin: followed, with the token
        assert "num_requests_running" in metrics["stdout"]
    finally:
        for server in servers:
            server.shutdown()


@ROOT_ONLY
def test_the_read_access_check_is_made_on_the_file_actually_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Check-then-read on a path lets the service user swap the file in between (a symlink to
    a root-only file); the probe judges the descriptor it reads from."""
    from kvops.probe import core

    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash:19000::::::\n")
    secret.chmod(0o600)
    decoy = tmp_path / "lmcache.yaml"
    decoy.write_text("chunk_size: 256\n")
    decoy.chmod(0o644)
    world_readable = os.stat(decoy)  # what a path lookup sees once the decoy is back in place
    monkeypatch.setattr(core.os, "stat", lambda *a, **k: world_readable)
    item = Probe({}).file("lmcache_config", str(secret), readable_by="nobody")
    assert "not readable by the service user nobody" in item["error"]
    assert "stdout" not in item


@ROOT_ONLY
def test_a_fifo_named_by_the_service_is_not_read_and_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "lmcache.yaml"
    os.mkfifo(fifo)
    fifo.chmod(0o644)
    item = Probe({}).file("lmcache_config", str(fifo), readable_by="nobody")
    assert "not a regular file" in item["error"]
