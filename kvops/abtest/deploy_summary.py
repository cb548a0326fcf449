"""What `ab-test --deploy` put on the host, as results.json and the reports show it.

Why a summary and not deploys.jsonl verbatim: a reader of the report must see, per arm, whether
its deploys succeeded and exactly what it measured - engine and LMCache versions, the rendered
LMCache config, the connector JSON, the command line and environment - without reading one line
per deploy (a four-trial run has ten). The raw lines stay in deploys.jsonl.

Pure: the records in, a JSON-ready dict out. Every value passes through the one redactor
(kvops.probe.redact) again, so a deploys.jsonl written before the deployer redacted, or a
secret inside a play's error message, never reaches a report.
"""

from __future__ import annotations

from typing import Any

from kvops.probe.redact import redact_text, redact_value

# The packages whose versions decide what an arm measured. kvops is the engine where the lab's
# `kvops sim serve` stands in for vLLM (tests/lab/deploy_lab_vars.yml).
ENGINE_PACKAGES = ("vllm", "lmcache", "torch", "kvops")
MAX_ERROR_CHARS = 500


def _outcome(index: int, rec: dict[str, Any]) -> dict[str, Any]:
    errors = [str(e) for e in rec.get("errors") or []]
    return {
        "index": index,
        "arm": rec.get("arm"),
        "variant": rec.get("variant"),
        "status": rec.get("status"),
        "rc": rec.get("rc"),
        "started_at": rec.get("started_at"),
        "duration_s": rec.get("duration_s"),
        "changed_tasks": rec.get("changed_tasks"),
        "error": redact_text(errors[0][:MAX_ERROR_CHARS]) if errors else "",
    }


def _host_view(deployed: dict[str, Any]) -> dict[str, Any]:
    """One host's `vllm_lmcache_deployed` fact (roles/vllm_lmcache/tasks/present.yml), cut to
    what identifies the arm, secrets redacted."""
    raw_packages = deployed.get("packages")
    packages = raw_packages if isinstance(raw_packages, dict) else {}
    engine = {
        name: str(packages[name])
        for name in ENGINE_PACKAGES
        if isinstance(packages.get(name), str | int | float)
    }
    view: dict[str, Any] = redact_value(
        {
            "install_method": deployed.get("install_method"),
            "image": deployed.get("image") or None,
            "vllm_version": engine.get("vllm"),
            "lmcache_version_installed": engine.get("lmcache"),
            "lmcache_version_configured": deployed.get("lmcache_version"),
            "packages": engine,
            "service": deployed.get("service"),
            "lmcache_config": deployed.get("lmcache_config") or {},
            "kv_transfer_config": deployed.get("kv_transfer_config") or {},
            "exec_start": deployed.get("exec_start"),
            "environment": deployed.get("environment") or {},
        }
    )
    return view


def summarize_deploys(
    records: list[dict[str, Any]], settings: dict[str, Any], arm_names: list[str]
) -> dict[str, Any]:
    """results.json's `deploy` block from deploys.jsonl's lines (in run order), the run's deploy
    settings (run.json) and the arms in plan order.

    Each arm's `deployed` is what its latest successful deploy reported per host; an arm whose
    deploys all failed (or never ran) has none, and its `last_status` says which."""
    outcomes = [_outcome(i + 1, rec) for i, rec in enumerate(records)]
    arms: dict[str, Any] = {}
    for name in arm_names:
        mine = [r for r in records if r.get("arm") == name]
        ok = [r for r in mine if r.get("status") == "successful"]
        deployed = ok[-1].get("deployed") if ok else None
        arms[name] = {
            "variant": mine[-1].get("variant") if mine else name,
            "deploys": len(mine),
            "failed": sum(1 for r in mine if r.get("status") != "successful"),
            "last_status": str(mine[-1].get("status")) if mine else "not deployed",
            "deployed": (
                {str(h): _host_view(v) for h, v in deployed.items() if isinstance(v, dict)}
                if isinstance(deployed, dict)
                else {}
            ),
        }
    return {
        "limit": settings.get("limit"),
        "inventories": list(settings.get("inventories") or []),
        "clear_gds_dir": bool(settings.get("clear_gds_dir", True)),
        "extra_vars": redact_value(dict(settings.get("extra_vars") or {})),
        "outcomes": outcomes,
        "arms": arms,
    }


def failed_deploy_detail(summary: dict[str, Any]) -> str:
    """One sentence for results.json's status_detail when the run stopped at a failed deploy:
    the last deploy failed ("" otherwise: a failure a later --resume got past is history,
    kept in `outcomes`)."""
    if not summary["outcomes"] or summary["outcomes"][-1]["status"] == "successful":
        return ""
    last = summary["outcomes"][-1]
    return (
        f"deploy {last['index']} (arm {last['arm']}, variant {last['variant']}) on "
        f"{summary['limit']} ended {last['status']}: {last['error'] or 'no error reported'}"
    )
