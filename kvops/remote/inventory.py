"""Hosts and their variables, read through `ansible-inventory --list`.

Why a subprocess and not a YAML reader: group_vars, host_vars, inventory plugins, `--limit`
patterns and vault all behave exactly as in Ansible only if Ansible resolves them. kvops then
reads the few connection variables it needs (`ansible_host`, `ansible_port`, `ansible_user`,
`ansible_ssh_private_key_file`, `ansible_ssh_common_args`, `ansible_become*`,
`ansible_python_interpreter`) and its own `kvops_*` probe settings (see README).

Variables are not Jinja-templated by `ansible-inventory --list`; a value that still contains
`{{` is reported as a warning rather than guessed at.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvops.errors import KvopsError


def host_number(
    host: InventoryHost, var: str, default: float, minimum: float = 0, integer: bool = False
) -> float:
    """A numeric host variable, or InventoryError naming the host and the variable: a value
    such as `"20s"` is a usage error (exit 2) before anything connects, never a traceback."""
    raw = host.vars.get(var)
    if raw is None or raw == "":
        return default
    kind = "a whole number" if integer else "a number"
    try:
        if isinstance(raw, bool):
            raise ValueError(raw)
        value = float(raw)
        if integer and not value.is_integer():
            raise ValueError(raw)
    except (TypeError, ValueError):
        raise InventoryError(f"{host.name}: {var} = {raw!r} is not {kind}") from None
    if value < minimum:
        raise InventoryError(f"{host.name}: {var} = {raw!r} must be >= {minimum:g}")
    return value


class InventoryError(KvopsError):
    """The inventory could not be read or matched no host: `kvops validate` exits 2."""


@dataclass(frozen=True)
class Jump:
    """One SSH jump host (from `-J`/`-o ProxyJump=` in the inventory's ssh args)."""

    host: str
    port: int = 22
    user: str | None = None
    # The hop's own credentials (from its inventory entry); never the target's.
    key_file: str | None = None
    password: str | None = None
    known_hosts_file: str | None = None


@dataclass
class InventoryHost:
    """One host as kvops connects to it, plus every variable Ansible resolved for it."""

    name: str
    groups: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # Inventory hosts a ProxyJump hop may name (credentials for the hop come from them).
    jump_hosts: list[InventoryHost] = field(default_factory=list, repr=False)

    @property
    def address(self) -> str:
        return str(self.vars.get("ansible_host") or self.vars.get("ansible_ssh_host") or self.name)

    @property
    def port(self) -> int:
        name = "ansible_port" if "ansible_port" in self.vars else "ansible_ssh_port"
        value = host_number(self, name, 22, minimum=1, integer=True)
        if value > 65535:
            raise InventoryError(f"{self.name}: {name} = {value} is not a TCP port (1-65535)")
        return int(value)

    @property
    def user(self) -> str | None:
        user = self.vars.get("ansible_user") or self.vars.get("ansible_ssh_user")
        return str(user) if user else None

    @property
    def key_file(self) -> str | None:
        key = self.vars.get("ansible_ssh_private_key_file") or self.vars.get(
            "ansible_private_key_file"
        )
        return os.path.expanduser(str(key)) if key else None

    @property
    def password(self) -> str | None:
        """SSH password if the inventory (usually a vault) gives one; never logged."""
        pw = self.vars.get("ansible_password") or self.vars.get("ansible_ssh_pass")
        return str(pw) if pw else None

    @property
    def connection(self) -> str:
        return str(self.vars.get("ansible_connection") or "ssh")

    @property
    def become(self) -> bool:
        return as_bool(self.vars.get("ansible_become", False))

    @property
    def become_user(self) -> str:
        return str(self.vars.get("ansible_become_user") or "root")

    @property
    def become_method(self) -> str:
        return str(self.vars.get("ansible_become_method") or "sudo")

    @property
    def become_password(self) -> str | None:
        pw = self.vars.get("ansible_become_password") or self.vars.get("ansible_become_pass")
        return str(pw) if pw else None

    @property
    def python(self) -> str:
        """Target interpreter; Ansible's `auto*` discovery values mean "python3 on PATH"."""
        interp = str(self.vars.get("ansible_python_interpreter") or "python3")
        return "python3" if interp.startswith("auto") else interp

    @property
    def ssh_args(self) -> list[str]:
        args: list[str] = []
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            value = self.vars.get(key)
            if value:
                args.extend(shlex.split(str(value)))
        return args

    @property
    def jumps(self) -> list[Jump]:
        """The hops, each with its own credentials when the inventory has an entry for it
        (matched by inventory name or ansible_host, and port): a jump host never receives the
        target's password or key (it may belong to someone else)."""
        hops = []
        for hop in parse_proxy_jump(self.ssh_args):
            entry = next((h for h in self.jump_hosts if _is_hop(h, hop)), None)
            if entry is not None:
                hop = replace(
                    hop,
                    user=hop.user or entry.user,
                    key_file=entry.key_file,
                    password=entry.password,
                    known_hosts_file=entry.known_hosts_file,
                )
            hops.append(hop)
        return hops

    @property
    def proxy_command(self) -> str | None:
        return ssh_option(self.ssh_args, "proxycommand")

    @property
    def known_hosts_file(self) -> str | None:
        """`-o UserKnownHostsFile=` from the ssh args (the first file), as Ansible's ssh uses."""
        value = ssh_option(self.ssh_args, "userknownhostsfile")
        if not value or value.lower() == "none":
            return None
        return os.path.expanduser(shlex.split(value)[0])


def _is_hop(entry: InventoryHost, hop: Jump) -> bool:
    return hop.host in (entry.name, entry.address) and hop.port == entry.port


def as_bool(value: Any) -> bool:
    """Ansible's truthiness for inventory strings ("yes", "True", "1", "on")."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in {"1", "yes", "true", "on", "y"}


def ssh_option(args: list[str], name: str) -> str | None:
    """Value of `-o Name=value` / `-o Name value` / `-oName=value` in ssh args (last wins)."""
    found: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        opt: str | None = None
        if arg == "-o" and i + 1 < len(args):
            opt = args[i + 1]
            i += 1
        elif arg.startswith("-o") and len(arg) > 2:
            opt = arg[2:]
        if opt is not None:
            key, _, value = opt.replace("=", " ", 1).partition(" ")
            if key.strip().lower() == name:
                found = value.strip()
        i += 1
    return found


def parse_proxy_jump(args: list[str]) -> list[Jump]:
    """Jump hosts from `-J a,b` or `-o ProxyJump=[user@]host[:port],...` (in hop order)."""
    spec: str | None = None
    for i, arg in enumerate(args):
        if arg == "-J" and i + 1 < len(args):
            spec = args[i + 1]
        elif arg.startswith("-J") and len(arg) > 2:
            spec = arg[2:]
    spec = ssh_option(args, "proxyjump") or spec
    if not spec or spec.lower() == "none":
        return []
    jumps = []
    for hop in spec.split(","):
        hop = hop.strip()
        if hop.startswith("ssh://"):
            hop = hop[len("ssh://") :]
        user, _, hostport = hop.rpartition("@")
        host, port = hostport, 22
        if hostport.startswith("["):
            host, _, rest = hostport[1:].partition("]")
            port = _hop_port(rest[1:], hop) if rest.startswith(":") else 22
        elif hostport.count(":") == 1:
            host, _, p = hostport.partition(":")
            port = _hop_port(p, hop)
        jumps.append(Jump(host=host, port=port, user=user or None))
    return jumps


def _hop_port(text: str, hop: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InventoryError(f"ProxyJump hop {hop!r}: port {text!r} is not a TCP port")
    return int(text)


def _collect_hosts(data: dict[str, Any]) -> dict[str, list[str]]:
    """host -> groups it belongs to, by walking the group tree from `all`."""
    membership: dict[str, list[str]] = {}
    seen: set[str] = set()

    def walk(group: str, ancestors: list[str]) -> None:
        if group in ancestors:  # defensive: a cycle would be an Ansible bug
            return
        node = data.get(group) or {}
        chain = [*ancestors, group]
        for host in node.get("hosts", []) or []:
            groups = membership.setdefault(host, [])
            for g in chain:
                if g not in groups:
                    groups.append(g)
        seen.add(group)
        for child in node.get("children", []) or []:
            walk(child, chain)

    walk("all", [])
    return membership


def ansible_inventory_exe() -> str:
    """`ansible-inventory` next to the running Python (the venv), else on PATH."""
    local = Path(sys.executable).parent / "ansible-inventory"
    if local.exists():
        return str(local)
    found = shutil.which("ansible-inventory")
    if not found:
        raise InventoryError("ansible-inventory not found (install ansible into this environment)")
    return found


def load_inventory(
    sources: list[str],
    limit: str | None = None,
    vault_password_files: list[str] | None = None,
    vault_ids: list[str] | None = None,
    extra_vars: list[str] | None = None,
    timeout_s: float = 120.0,
) -> list[InventoryHost]:
    """Hosts matching `limit` with their resolved variables, in inventory order.

    Raises InventoryError with Ansible's own message when the inventory cannot be parsed
    (missing path, YAML error, vault without a password) or nothing matches."""
    # no source: the inventory Ansible is configured with (ANSIBLE_INVENTORY, ansible.cfg), as
    # for ansible-inventory itself
    for src in sources:
        if "," not in src and not Path(src).exists():
            raise InventoryError(f"inventory {src!r} does not exist")
    cmd = [ansible_inventory_exe(), "--list"]
    for src in sources:
        cmd += ["-i", src]
    if limit:
        cmd += ["--limit", limit]
    for vpf in vault_password_files or []:
        cmd += ["--vault-password-file", vpf]
    for vid in vault_ids or []:
        cmd += ["--vault-id", vid]
    for ev in extra_vars or []:
        cmd += ["-e", ev]
    env = dict(os.environ)
    # Unparsable sources must be an error, not a warning followed by an empty inventory.
    env.setdefault("ANSIBLE_INVENTORY_UNPARSED_FAILED", "true")
    env.setdefault("ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED", "true")
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise InventoryError(f"ansible-inventory did not answer within {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        msg = _ansible_error(proc.stderr) or f"exit {proc.returncode}"
        if "no vault secrets" in msg:
            msg += " (give --vault-password-file or --vault-id, or set ANSIBLE_VAULT_PASSWORD_FILE)"
        raise InventoryError(f"ansible-inventory failed: {msg}")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"ansible-inventory printed no JSON: {exc}") from exc
    hosts = hosts_from_list(data, limit=limit)
    _decrypt_vaulted(hosts, vault_password_files or [], vault_ids or [], timeout_s)
    for host in hosts:
        host.jump_hosts = hosts
    return hosts


def _vaulted(value: Any) -> str | None:
    if isinstance(value, dict) and set(value) == {"__ansible_vault"}:
        return str(value["__ansible_vault"])
    return None


def _decrypt_vaulted(
    hosts: list[InventoryHost], password_files: list[str], vault_ids: list[str], timeout_s: float
) -> None:
    """Decrypt inline-vaulted values kvops uses (`ansible_*`, `kvops_*`) with `ansible-vault`.

    `ansible-inventory --list` prints `!vault` strings still encrypted. Only the variables
    kvops reads are decrypted (one call per distinct ciphertext); without a vault password
    source the value is dropped with a warning instead of prompting on a terminal."""
    have_secret = bool(password_files or vault_ids or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE"))
    exe = str(Path(ansible_inventory_exe()).with_name("ansible-vault"))
    cache: dict[str, str | None] = {}
    for host in hosts:
        for key, value in list(host.vars.items()):
            cipher = _vaulted(value)
            if cipher is None or not key.startswith(("ansible_", "kvops_")):
                continue
            if not have_secret:
                host.vars.pop(key)
                host.warnings.append(f"{key} is vaulted and no --vault-password-file was given")
                continue
            if cipher not in cache:
                cmd = [exe, "decrypt", "--output", "-"]
                for vpf in password_files:
                    cmd += ["--vault-password-file", vpf]
                for vid in vault_ids:
                    cmd += ["--vault-id", vid]
                try:
                    proc = subprocess.run(
                        cmd, input=cipher, capture_output=True, text=True, timeout=timeout_s
                    )
                except subprocess.TimeoutExpired:
                    raise InventoryError(
                        f"{host.name}: {key}: ansible-vault did not decrypt it within "
                        f"{timeout_s:.0f} s (a password prompt or script waiting?)"
                    ) from None
                cache[cipher] = proc.stdout if proc.returncode == 0 else None
            plain = cache[cipher]
            if plain is None:
                host.vars.pop(key)
                host.warnings.append(f"{key} is vaulted and could not be decrypted")
            else:
                host.vars[key] = plain


def _ansible_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("ERROR", "[ERROR]"))]
    # The first plugin's complaint and its Origin line carry the real cause (file:line:col).
    causes = [ln for ln in lines if "Failed to parse" in ln and ln.startswith("[WARNING]")][:1]
    origins = [ln for ln in lines if ln.startswith("Origin:")][:1]
    return " ".join(errors + causes + origins or lines[-3:])[:800]


def hosts_from_list(data: dict[str, Any], limit: str | None = None) -> list[InventoryHost]:
    """Build hosts from `ansible-inventory --list` JSON (already limited by Ansible)."""
    hostvars: dict[str, Any] = (data.get("_meta") or {}).get("hostvars") or {}
    membership = _collect_hosts(data)
    names = list(membership) + [h for h in hostvars if h not in membership]
    if not names:
        what = f"the pattern {limit!r}" if limit else "the inventory"
        raise InventoryError(f"no hosts matched by {what}")
    hosts = []
    for name in names:
        hvars = dict(hostvars.get(name) or {})
        groups = [g for g in membership.get(name, []) if g != "all"]
        host = InventoryHost(name=name, groups=groups, vars=hvars)
        for key, value in hvars.items():
            if (
                isinstance(value, str)
                and "{{" in value
                and (key.startswith(("ansible_", "kvops_")))
            ):
                host.warnings.append(f"{key} is an unrendered Jinja template; kvops uses it as is")
        role = hvars.get("kvops_role")
        if role not in (None, "") and str(role).strip().lower() not in KNOWN_ROLES:
            known = ", ".join(KNOWN_ROLES)
            host.warnings.append(f"kvops_role {role!r} unknown ({known}); judged by its groups")
        floor = hvars.get("kvops_min_free_gib")
        if floor not in (None, "") and _min_free_gib(host) is None:
            host.warnings.append(f"kvops_min_free_gib {floor!r} is not a number >= 0; ignored")
        hosts.append(host)
    return hosts


# --- kvops probe settings from host variables (documented in README, `kvops validate`) ---
DEFAULT_VLLM_URL = "http://127.0.0.1:8000"
DEFAULT_VLLM_SERVICE = "vllm.service"
DEFAULT_GDSIO = {"size": "1G", "io_size": "1M", "threads": "8", "gpu": "0"}
SETTING_VARS = {  # Settings key -> host variable
    "gds_dir": "kvops_gds_dir",
    "vllm_url": "kvops_vllm_url",
    "vllm_service": "kvops_vllm_service",
    "service_user": "kvops_service_user",
    "lmcache_config_path": "kvops_lmcache_config",
    "expected_model": "kvops_expected_model",
    "cufile_json_path": "kvops_cufile_json",
    # offload_mp (LMCache's multiprocess server): its unit and HTTP frontend
    "lmcache_server_service": "kvops_lmcache_server_service",
    "lmcache_server_url": "kvops_lmcache_server_url",
    # the timer that runs `kvops gds prune` on the store (role vllm_lmcache)
    "gds_prune_timer": "kvops_gds_prune_timer",
}
GDSIO_VARS = {"size": "kvops_gdsio_size", "io_size": "kvops_gdsio_io_size"}
GDSIO_VARS.update(threads="kvops_gdsio_threads", gpu="kvops_gdsio_gpu")
# `none`: no inference service on the host (yet); vLLM/LMCache checks SKIP (kvops.evidence).
KNOWN_ROLES = ("baseline", "offload", "none")


def host_role(host: InventoryHost) -> str:
    """`kvops_role` (baseline, offload, or none: no inference service on the host), else
    membership of a group named `baseline`/`offload`, else offload."""
    role = str(host.vars.get("kvops_role") or "").strip().lower()
    if role in KNOWN_ROLES:
        return role
    if "baseline" in host.groups and "offload" not in host.groups:
        return "baseline"
    return "offload"


def _min_free_gib(host: InventoryHost) -> float | None:
    value = host.vars.get("kvops_min_free_gib")
    if not isinstance(value, (int, float, str)) or isinstance(value, bool) or value == "":
        return None
    try:
        floor = float(value)
    except (TypeError, ValueError):
        return None
    return floor if floor >= 0 else None


def probe_settings(
    host: InventoryHost, storage_bench: bool = False, gdsio: dict[str, str] | None = None
) -> dict[str, Any]:
    """The evidence `Settings` for a host (what the probe looks at, what checks expect)."""
    settings: dict[str, Any] = {
        "vllm_url": DEFAULT_VLLM_URL,
        "vllm_service": DEFAULT_VLLM_SERVICE,
    }
    for key, var in SETTING_VARS.items():
        if host.vars.get(var) not in (None, ""):
            settings[key] = str(host.vars[var])
    settings["role"] = host_role(host)
    floor = _min_free_gib(host)
    if floor is not None:
        settings["min_free_gib"] = floor
    settings["storage_bench"] = bool(storage_bench)
    args = dict(DEFAULT_GDSIO)
    for key in ("threads", "gpu"):
        host_number(host, GDSIO_VARS[key], 0, minimum=1 if key == "threads" else 0, integer=True)
    args.update({k: str(host.vars[v]) for k, v in GDSIO_VARS.items() if host.vars.get(v)})
    args.update({k: v for k, v in (gdsio or {}).items() if v})
    settings["gdsio_args"] = args
    return settings


def probe_options(host: InventoryHost) -> dict[str, Any]:
    """Probe-only options: path roots (the recorded-tree seam), extra tool dirs, timeouts."""
    opts: dict[str, Any] = {}
    roots = host.vars.get("kvops_probe_roots")
    if isinstance(roots, dict):
        opts["roots"] = {k: str(v) for k, v in roots.items() if k in ("proc", "sys", "etc")}
    dirs = host.vars.get("kvops_probe_tool_dirs")
    if dirs:
        opts["tool_dirs"] = [str(d) for d in (dirs if isinstance(dirs, list) else [dirs])]
    # vLLM started with --api-key answers /v1/* only with the token (vLLM docs, "API key"):
    # from the (vaulted) host var, else the environment; passed to the probe on stdin, never
    # into settings or evidence.
    token = host.vars.get("kvops_vllm_api_key") or os.environ.get("KVOPS_VLLM_API_KEY")
    if token:
        opts["http_bearer_token"] = str(token)
    ca_file = host.vars.get("kvops_vllm_ca_bundle")
    if ca_file:
        opts["http_ca_file"] = str(ca_file)
    for key in ("command_timeout_s", "http_timeout_s", "bench_timeout_s"):
        var = f"kvops_probe_{key}"
        if host.vars.get(var) not in (None, ""):
            opts[key] = host_number(host, var, 0.0, minimum=0.1)
    return opts
