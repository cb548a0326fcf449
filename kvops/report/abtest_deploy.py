"""The "Deploys" section of an `ab-test --deploy` report (Markdown and HTML).

Why in the report: an A/B result is only as good as the claim that the arms differed in the
variant alone. The reader sees every deploy's outcome in run order and, per arm, the versions,
the rendered LMCache config, the connector JSON, the command line and environment the arm was
measured with (results.json `deploy`, already redacted by kvops.abtest.deploy_summary).

Most of it was read back from the host (versions, command line, environment, the deploy's
error): `host_text.printable` before any format, one line where a newline would forge a row
or a list item, then `html.escape` in HTML.
"""

from __future__ import annotations

import html
import json
from typing import Any

import yaml

from kvops.report.host_text import markdown_code, markdown_fence, markdown_inline, printable

_HEAD = ["#", "arm", "variant", "status", "started", "s", "changed tasks", "error"]


def _or_blank(value: Any) -> str:
    return "" if value is None else str(value)


def _outcome_rows(deploy: dict[str, Any]) -> list[list[str]]:
    rows = [
        [
            str(o["index"]), str(o["arm"]), str(o["variant"]), str(o["status"]),
            str(o.get("started_at") or ""), _or_blank(o.get("duration_s")),
            _or_blank(o.get("changed_tasks")),
            str(o.get("error") or ""),
        ]
        for o in deploy["outcomes"]
    ]  # fmt: skip
    return [[printable(cell, one_line=True) for cell in row] for row in rows]


def _intro(deploy: dict[str, Any]) -> str:
    cleared = "emptied before every deploy" if deploy["clear_gds_dir"] else "kept between deploys"
    return (
        f"Host `{deploy['limit']}` switched with playbooks/deploy.yml before each arm's info "
        f"and each segment; GDS directory {cleared}. Inventories: "
        + ", ".join(f"`{i}`" for i in deploy["inventories"])
        + "."
    )


def _versions(host: dict[str, Any]) -> str:
    parts = [f"install {host.get('install_method')}"]
    if host.get("image"):
        parts.append(f"image {host['image']}")
    parts.append(f"vLLM {host.get('vllm_version') or 'not a pip package here'}")
    configured = host.get("lmcache_version_configured")
    installed = host.get("lmcache_version_installed")
    parts.append(
        f"LMCache {installed or 'not a pip package here'} (config rendered for {configured})"
    )
    others = {k: v for k, v in (host.get("packages") or {}).items() if k not in ("vllm", "lmcache")}
    parts += [f"{k} {v}" for k, v in others.items()]
    return printable(", ".join(parts), one_line=True)


def _config_yaml(config: dict[str, Any]) -> str:
    return printable(yaml.safe_dump(config, sort_keys=True, default_flow_style=False).rstrip())


def _command(view: dict[str, Any]) -> str:
    return printable(view.get("exec_start"), one_line=True)


def _environment(view: dict[str, Any]) -> str:
    env = " ".join(f"{k}={v}" for k, v in sorted(view["environment"].items()))
    return printable(env, one_line=True)


def deploy_markdown(deploy: dict[str, Any]) -> list[str]:
    out = ["## Deploys", "", markdown_inline(_intro(deploy)), ""]
    out += ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    rows = _outcome_rows(deploy)
    out += [
        "| " + " | ".join(markdown_inline(c).replace("|", "\\|") for c in r) + " |" for r in rows
    ]
    for name, arm in deploy["arms"].items():
        out += [
            "",
            f"### arm {name}: variant {arm['variant']}",
            "",
            f"{arm['deploys']} deploy(s), {arm['failed']} failed; last: {arm['last_status']}.",
        ]
        for host, view in arm["deployed"].items():
            name = markdown_code(host)
            out += ["", f"- {name}: {markdown_inline(_versions(view))}"]
            out += [f"- command: {markdown_code(_command(view))}"]
            out += [f"- environment: {markdown_code(_environment(view))}"]
            if view["kv_transfer_config"]:
                out += [f"- connector: {markdown_code(json.dumps(view['kv_transfer_config']))}"]
            if view["lmcache_config"]:
                config = _config_yaml(view["lmcache_config"])
                fence = markdown_fence(config)
                out += ["- LMCache config:", "", f"{fence}yaml", config, fence]
            else:
                out += ["- LMCache config: none (no KV connector in this variant)"]
    return out


def deploy_html(deploy: dict[str, Any]) -> list[str]:
    e = html.escape
    parts = [f"<h2>Deploys</h2><p>{e(_intro(deploy))}</p><table><tr>"]
    parts[0] += "".join(f"<th>{e(h)}</th>" for h in _HEAD) + "</tr>"
    for r in _outcome_rows(deploy):
        parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>")
    parts.append("</table>")
    for name, arm in deploy["arms"].items():
        parts.append(
            f"<h3>arm {e(name)}: variant {e(str(arm['variant']))}</h3><p>{arm['deploys']} "
            f"deploy(s), {arm['failed']} failed; last: {e(arm['last_status'])}.</p><ul>"
        )
        for host, view in arm["deployed"].items():
            parts += [
                f"<li><code>{e(printable(host))}</code>: {e(_versions(view))}</li>",
                f"<li>command: <code>{e(_command(view))}</code></li>",
                f"<li>environment: <code>{e(_environment(view))}</code></li>",
            ]
            if view["kv_transfer_config"]:
                connector = json.dumps(view["kv_transfer_config"])
                parts.append(f"<li>connector: <code>{e(connector)}</code></li>")
            if view["lmcache_config"]:
                config = _config_yaml(view["lmcache_config"])
                parts.append(f"<li>LMCache config:<pre>{e(config)}</pre></li>")
            else:
                parts.append("<li>LMCache config: none (no KV connector in this variant)</li>")
        parts.append("</ul>")
    return parts
