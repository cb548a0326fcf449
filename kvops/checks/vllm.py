"""The vLLM endpoint as users see it, and the connector that makes it an offload host."""

from __future__ import annotations

import json
from typing import Any

from kvops import evidence as ev
from kvops.checks.context import Context
from kvops.checks.model import Finding, Severity, finding
from kvops.parse._common import clip, clip_repr
from kvops.parse.prometheus import parse_prometheus_text

CONNECTOR = "LMCacheConnectorV1"
# The form that loads LMCache's own connector module (works on lmcache 0.5.6 and 0.5.7:
# https://docs.lmcache.ai, vLLM kv_connector/factory.py `LMCacheConnectorV1Dynamic`).
DYNAMIC_CONNECTOR = "LMCacheConnectorV1Dynamic"
# LMCache's multiprocess server (role variant offload_mp): vLLM's bundled LMCacheMPConnector or
# LMCache's own (kv_connector_module_path lmcache.integration.vllm.lmcache_mp_connector).
MP_CONNECTOR = "LMCacheMPConnector"


def _is_lmcache(config: Any) -> bool:
    if not isinstance(config, dict):
        return False
    connector = config.get("kv_connector")
    module = str(config.get("kv_connector_module_path") or "")
    return connector in (CONNECTOR, MP_CONNECTOR) or (
        connector == DYNAMIC_CONNECTOR and "lmcache" in module
    )


def is_lmcache_server(ctx: Context) -> bool:
    """vLLM talks to LMCache's multiprocess server (offload_mp): LMCache's config, log and
    metrics are the server's, not vLLM's."""
    config = ctx.kv_transfer_config
    if isinstance(config, dict) and config.get("kv_connector") == MP_CONNECTOR:
        return True
    return bool(
        ctx.settings.get("lmcache_server_service") or ctx.settings.get("lmcache_server_url")
    )


ROLE_REMEDY = "Set kvops_role to baseline or offload for a host that serves inference."


NO_SERVICE = "kvops_role none: no inference service declared on this host"


def check_healthy(ctx: Context) -> list[Finding]:
    item = ctx.item(ev.HTTP_HEALTH)
    if ctx.role == ev.ROLE_NONE:
        if item is not None and ev.item_problem(item) is None:
            # Declared absent, yet something answers: say so rather than judge it blind.
            msg = f"{NO_SERVICE}, yet {ev.source_text(item)} answers HTTP {item.get('http_status')}"
            return [finding("GDS-070", Severity.WARN, msg, remedy=ROLE_REMEDY)]
        return [finding("GDS-070", Severity.SKIP, NO_SERVICE)]
    if item is None:
        return [ctx.skip("GDS-070", ev.HTTP_HEALTH)]
    if ev.item_problem(item) is None:
        version = _vllm_version(ctx)
        shown = f"{ev.source_text(item)}: HTTP {item.get('http_status')}"
        return [
            finding("GDS-070", Severity.PASS, shown + (f" (vLLM {version})" if version else ""))
        ]
    return [finding("GDS-070", Severity.FAIL, f"not healthy: {ctx.problem(ev.HTTP_HEALTH)}")]


def _vllm_version(ctx: Context) -> str | None:
    text = ctx.text(ev.HTTP_VERSION)
    try:
        version = json.loads(text).get("version") if text else None
    except (json.JSONDecodeError, AttributeError):
        return None
    return str(version) if version else None


def check_model_served(ctx: Context) -> list[Finding]:
    if ctx.role == ev.ROLE_NONE:
        return [finding("GDS-071", Severity.SKIP, NO_SERVICE)]
    text = ctx.text(ev.HTTP_MODELS)
    if text is None:
        return [ctx.skip("GDS-071", ev.HTTP_MODELS)]
    try:
        body = json.loads(text)
        served = [str(m["id"]) for m in body.get("data", []) if isinstance(m, dict) and "id" in m]
    except (json.JSONDecodeError, AttributeError, TypeError) as exc:
        return [finding("GDS-071", Severity.FAIL, f"/v1/models is not an OpenAI list: {exc}")]
    expected = ctx.settings.get("expected_model")
    if expected:
        if expected in served:
            return [finding("GDS-071", Severity.PASS, f"serves {expected}")]
        return [finding("GDS-071", Severity.FAIL, f"{expected} not served; serves {served}")]
    if served:
        msg = f"serves {clip(str(served))} (no expected_model set)"
        return [finding("GDS-071", Severity.PASS, msg)]
    return [finding("GDS-071", Severity.FAIL, "/v1/models lists no model")]


def check_kv_transfer_config(ctx: Context) -> list[Finding]:
    if ctx.role == ev.ROLE_NONE:
        return [finding("GDS-072", Severity.SKIP, NO_SERVICE)]
    config = ctx.kv_transfer_config
    if ctx.vllm_argv is None and config is None:
        return [ctx.skip("GDS-072", ev.VLLM_PROCESS, ev.VLLM_UNIT)]
    connector = config.get("kv_connector") if isinstance(config, dict) else None
    where = f" (from {ctx.kv_transfer_config_source})" if config is not None else ""
    shown = f"--kv-transfer-config {json.dumps(config) if config is not None else '(absent)'}"
    if ctx.role == ev.ROLE_OFFLOAD:
        role = config.get("kv_role") if isinstance(config, dict) else None
        if _is_lmcache(config) and role == "kv_both":
            msg = f"kv_connector {connector}, kv_both{where}"
            return [finding("GDS-072", Severity.PASS, msg, shown)]
        if _is_lmcache(config):
            msg = f"kv_role={clip_repr(role)}: a single host both stores and loads KV (kv_both)"
            return [finding("GDS-072", Severity.WARN, msg, shown)]
        if isinstance(config, str):
            return [finding("GDS-072", Severity.FAIL, "--kv-transfer-config is not JSON", shown)]
        msg = f"offload host without {CONNECTOR} (kv_connector={clip_repr(connector)})"
        _, unread = ctx.vllm_config_file
        if unread is not None:
            msg += f"; the --config file was not read: {unread}"
        return [finding("GDS-072", Severity.FAIL, msg, shown)]
    if ctx.role == ev.ROLE_BASELINE:
        if _is_lmcache(config):
            msg = f"baseline host runs {CONNECTOR}: the A/B baseline would offload too"
            return [
                finding(
                    "GDS-072",
                    Severity.WARN,
                    msg,
                    shown,
                    remedy="Deploy the baseline variant (playbooks/deploy.yml).",
                )
            ]
        return [finding("GDS-072", Severity.PASS, "baseline host without LMCache connector", shown)]
    return [finding("GDS-072", Severity.SKIP, "settings.role unset: connector not judged", shown)]


def check_metrics(ctx: Context) -> list[Finding]:
    if ctx.role == ev.ROLE_NONE:
        return [finding("GDS-073", Severity.SKIP, NO_SERVICE)]
    text = ctx.text(ev.HTTP_METRICS)
    if text is None:
        return [ctx.skip("GDS-073", ev.HTTP_METRICS)]
    metrics = parse_prometheus_text(text)
    has_vllm = metrics.has_prefix("vllm:")
    has_lmcache = metrics.has_prefix("lmcache:")
    shown = f"vllm:* {'present' if has_vllm else 'absent'}; lmcache:* "
    shown += "present" if has_lmcache else "absent"
    if not has_vllm:
        return [finding("GDS-073", Severity.WARN, "no vllm:* metrics on /metrics", shown)]
    if ctx.role == ev.ROLE_OFFLOAD and is_lmcache_server(ctx):
        return [_lmcache_server_metrics(ctx, shown)]
    if ctx.role == ev.ROLE_OFFLOAD and not has_lmcache:
        msg = "offload host exposes no lmcache:* metrics"
        return [finding("GDS-073", Severity.WARN, msg, shown)]
    return [finding("GDS-073", Severity.PASS, shown)]


MP_SETTINGS = "kvops_lmcache_server_service and kvops_lmcache_server_url"


def _lmcache_server_metrics(ctx: Context, shown: str) -> Finding:
    """offload_mp: LMCache publishes on its server's HTTP frontend, not on vLLM's /metrics; the
    server must answer its health check and publish lmcache_mp_*."""
    health = ctx.item(ev.LMCACHE_SERVER_HEALTH)
    if health is None or not ctx.settings.get("lmcache_server_url"):
        msg = f"vLLM uses {MP_CONNECTOR} but the LMCache server's URL is not declared"
        return finding("GDS-073", Severity.WARN, msg, shown, remedy=f"Set {MP_SETTINGS}.")
    if ev.item_problem(health) is not None:
        msg = f"LMCache server not healthy: {ctx.problem(ev.LMCACHE_SERVER_HEALTH)}"
        return finding("GDS-073", Severity.FAIL, msg, shown)
    text = ctx.text(ev.LMCACHE_SERVER_METRICS)
    if text is None:
        return ctx.skip("GDS-073", ev.LMCACHE_SERVER_METRICS)
    metrics = parse_prometheus_text(text)
    if not metrics.has_prefix("lmcache_mp_"):
        msg = "LMCache server healthy but its /metrics has no lmcache_mp_* (observability off?)"
        return finding("GDS-073", Severity.WARN, msg, shown)
    shown += f"; LMCache server {ev.source_text(health)}: HTTP {health.get('http_status')}"
    # LMCache's store controller publishes its attached L2 adapters by state, gauge
    # "lmcache_mp.l2_store_adapters" (0.5.6: lmcache/v1/distributed/storage_controllers/
    # store_controller.py)
    l2 = metrics.counter_value("lmcache_mp_l2_store_adapters", state="active")
    shown += "; lmcache_mp_* present" + (f", {l2:.0f} active L2 adapter(s)" if l2 else "")
    return finding("GDS-073", Severity.PASS, shown)


CHECKS = [check_healthy, check_model_served, check_kv_transfer_config, check_metrics]
