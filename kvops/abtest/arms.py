"""What each arm is, as the arm itself reports it, and the differences that are not offload.

Why: an A/B comparison is only about offload if the arms differ only in offload. A real case:
a connector-enabled vLLM silently took twice the CPU threads of its baseline and looked 2x
faster for reasons unrelated to offload. kvops cannot see everything, but it records and
compares everything the server says about itself: `/version`, the served model (and its
max_model_len), and the labels of `vllm:cache_config_info` other than the KV-connector ones.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from kvops.abtest.engine_counters import Counters, read_counters
from kvops.errors import KvopsError
from kvops.loadgen.client import read_text
from kvops.parse.prometheus import parse_prometheus_text

# cache_config_info labels that legitimately differ between a baseline and an offload arm
_OFFLOAD_LABEL = re.compile(r"kv_transfer|connector|offload|lmcache|kv_role|engine", re.I)


_HINTS = {
    "num_gpu_blocks": " - fewer GPU KV blocks is expected when the offload arm reserves GPU "
    "memory for its staging buffer (gds_buffer_size); any other cause is a confound",
}


class ArmUnreachable(KvopsError, RuntimeError):
    """An arm's URL does not answer at the start of a run (exit code 2)."""


@dataclass(frozen=True)
class Arm:
    """An arm: one endpoint (`url`), or several instances served as one arm (`url` first, then
    `more_urls`; `--arm NAME=URL1,URL2`), its load spread by `--route` (kvops.abtest.routing)."""

    name: str
    url: str
    model: str | None = None
    more_urls: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every instance's URL, the first one first."""
        return (self.url, *self.more_urls)


@dataclass
class ArmInfo:
    """Self-description of an arm, saved in the run directory and compared across arms."""

    name: str
    url: str
    version: str | None = None
    models: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    has_metrics: bool = False
    # the KV connector the arm's /metrics shows: cache_config_info's kv_connector label (kvops
    # sim), "lmcache" when LMCache's own metrics are exposed; None when it shows none
    connector: str | None = None
    has_reset: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def model(self) -> str | None:
        return self.models[0] if self.models else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_arm(text: str) -> Arm:
    """`NAME=URL` or `NAME=URL1,URL2,...` (as given to --arm; several URLs: one arm of several
    instances)."""
    name, sep, urls = text.partition("=")
    name = name.strip()
    if not sep or not name or not urls.strip():
        raise ValueError(f"--arm {text!r}: expected NAME=http://HOST:PORT[,http://HOST2:PORT...]")
    parts = [u.strip().rstrip("/") for u in urls.split(",")]
    for k, url in enumerate(parts, 1):
        if not url:
            raise ValueError(f"--arm {text!r}: URL {k} of {len(parts)} is empty")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--arm {text!r}: URL {k} ({url!r}) is not http://HOST:PORT")
    dup = next((u for k, u in enumerate(parts) if u in parts[:k]), None)
    if dup is not None:
        raise ValueError(f"--arm {text!r}: {dup} is listed twice (one instance, one URL)")
    return Arm(name, parts[0], None, tuple(parts[1:]))


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=15)) as resp:
        return resp.status, await read_text(resp)


async def fetch_arm_info(session: aiohttp.ClientSession, arm: Arm) -> ArmInfo:
    """Ask the arm who it is. Raises ArmUnreachable if `/v1/models` cannot be reached at all."""
    info = ArmInfo(arm.name, arm.url)
    try:
        status, body = await _get(session, arm.url + "/v1/models")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise ArmUnreachable(
            f"arm {arm.name}: cannot reach {arm.url} ({type(exc).__name__}: {exc}); "
            "is the server running and the URL right?"
        ) from None
    if status != 200:
        raise ArmUnreachable(f"arm {arm.name}: {arm.url}/v1/models answered HTTP {status}")
    _read_models(info, body)
    if arm.model:
        info.models = [arm.model] + [m for m in info.models if m != arm.model]
    for path, reader in (("/version", _read_version), ("/metrics", _read_metrics)):
        try:
            status, body = await _get(session, arm.url + path)
        except (aiohttp.ClientError, TimeoutError, OSError):
            info.notes.append(f"{path} unreachable")
            continue
        if status == 200:
            reader(info, body)
        else:
            info.notes.append(f"{path}: HTTP {status}")
    return info


def _read_models(info: ArmInfo, body: str) -> None:
    import json

    try:
        data = json.loads(body)
    except ValueError:
        return
    for m in data.get("data", []) if isinstance(data, dict) else []:
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            info.models.append(m["id"])
            if info.max_model_len is None and isinstance(m.get("max_model_len"), int):
                info.max_model_len = m["max_model_len"]


def _read_version(info: ArmInfo, body: str) -> None:
    import json

    try:
        data = json.loads(body)
    except ValueError:
        info.version = body.strip()[:80] or None
        return
    version = data.get("version") if isinstance(data, dict) else None
    info.version = str(version) if version is not None else None


def _read_metrics(info: ArmInfo, body: str) -> None:
    parsed = parse_prometheus_text(body)
    info.has_metrics = True
    for sample in parsed.find("vllm:cache_config_info"):
        info.cache_config.update(sample.labels)
    label = info.cache_config.get("kv_connector", "")
    if label and label.lower() not in ("none", "null"):
        info.connector = label
    elif parsed.has_prefix("lmcache:"):
        info.connector = "lmcache"


def arm_differences(infos: list[ArmInfo]) -> list[str]:
    """Warnings for every difference between arms other than the offload setting."""
    if len(infos) < 2:
        return []
    base = infos[0]
    warnings: list[str] = []
    for other in infos[1:]:
        pair = f"{base.name} vs {other.name}"
        if base.version != other.version:
            warnings.append(f"{pair}: server version differs ({base.version} vs {other.version})")
        if base.model != other.model:
            warnings.append(f"{pair}: served model differs ({base.model} vs {other.model})")
        if base.max_model_len != other.max_model_len:
            warnings.append(
                f"{pair}: max_model_len differs ({base.max_model_len} vs {other.max_model_len})"
            )
        keys = sorted(set(base.cache_config) | set(other.cache_config))
        for key in keys:
            if _OFFLOAD_LABEL.search(key):
                continue
            a, b = base.cache_config.get(key), other.cache_config.get(key)
            if a != b:
                hint = _HINTS.get(key, "")
                warnings.append(f"{pair}: cache_config_info {key} differs ({a} vs {b}){hint}")
        if base.has_metrics != other.has_metrics:
            warnings.append(f"{pair}: only one arm exposes /metrics")
    return warnings


def instance_differences(instances: Mapping[str, list[ArmInfo]]) -> list[str]:
    """Warnings for every difference between the instances of one arm (version, model,
    cache_config_info, the KV-connector labels included): a fleet arm is one variant, and an
    instance that differs measures something else under the arm's name."""
    out: list[str] = []
    for arm, infos in instances.items():
        if len(infos) < 2:
            continue
        named = [dataclasses.replace(i, name=f"{arm} {i.url}") for i in infos]
        out += [f"arm {arm}: {w}" for w in arm_differences(named)]
        base = infos[0]
        for other in infos[1:]:
            if base.connector != other.connector:
                out.append(
                    f"arm {arm}: KV connector differs between {base.url} ({base.connector}) "
                    f"and {other.url} ({other.connector})"
                )
    return out


async def reset_prefix_cache(session: aiohttp.ClientSession, info: ArmInfo) -> bool:
    """POST /reset_prefix_cache (vLLM needs VLLM_SERVER_DEV_MODE=1 for it); retried a few
    times since vLLM answers success=false while blocks are held. False when unavailable."""
    if info.has_reset is False:
        return False
    for _ in range(3):
        try:
            async with session.post(
                info.url + "/reset_prefix_cache", timeout=aiohttp.ClientTimeout(total=30)
            ) as resp:
                if resp.status in (404, 405):
                    info.has_reset = False
                    return False
                text = await read_text(resp, 64 * 1024, truncate=True)
                info.has_reset = resp.status == 200
                if resp.status == 200 and '"success":false' not in text.replace(" ", ""):
                    return True
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
    return False


async def fetch_counters(session: aiohttp.ClientSession, info: ArmInfo) -> Counters | None:
    """The arm's token counters now (`kvops.abtest.engine_counters`), or None when it has no
    readable /metrics."""
    body = await _metrics_text(session, info)
    return read_counters(body) if body is not None else None


async def _metrics_text(session: aiohttp.ClientSession, info: ArmInfo) -> str | None:
    """The arm's /metrics page, or None when it has none or it cannot be read now."""
    if not info.has_metrics:
        return None
    try:
        status, body = await _get(session, info.url + "/metrics")
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
    return body if status == 200 else None


EMISSION_LAG = "kvops:sim_emission_lag_seconds"


async def emission_lag(session: aiohttp.ClientSession, info: ArmInfo) -> tuple[float, int] | None:
    """(sum of seconds, steps) of the simulated engine's emission-lag histogram so far, or
    None for a server without it (a real vLLM): a segment's lag is the difference of two reads."""
    body = await _metrics_text(session, info)
    return None if body is None else emission_lag_of(body)


def emission_lag_of(metrics_text: str) -> tuple[float, int] | None:
    """(sum of seconds, steps) from a /metrics page, None without the histogram. The server
    is not trusted: a sum or count that is not a finite non-negative number counts as no
    histogram (it would otherwise void, or hide, every verdict of the run)."""
    parsed = parse_prometheus_text(metrics_text)
    total = parsed.counter_value(EMISSION_LAG + "_sum")
    count = parsed.counter_value(EMISSION_LAG + "_count")
    if total is None or count is None:
        return None
    if not (math.isfinite(total) and math.isfinite(count) and total >= 0 and count >= 0):
        return None
    return total, int(count)
