# Copyright: kvops contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Validation as a rollout gate: probe the host with kvops.gds.kvops_probe, judge the evidence
on the controller with kvops's own checks, fail the host when a check FAILs.

An action plugin runs on the controller and may run modules on the host
(https://docs.ansible.com/ansible/latest/dev_guide/developing_plugins.html#action-plugins):
here one module run (the probe), then the judges of ``kvops.validate.judge`` - the same as
``kvops validate`` - with the host's probe settings derived from its variables by
``kvops.remote.inventory`` as ``kvops validate`` derives them. A failed host counts against the
play's ``max_fail_percentage``, so a ``serial`` rollout stops at the first batch with a FAIL.
The judges need the kvops Python package where Ansible runs (``pip install kvops``: it brings
Ansible too).
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
---
action: kvops_gate
short_description: Fail a host whose kvops validation has a FAIL finding
description:
  - Probes the host with M(kvops.gds.kvops_probe) and judges the evidence on the controller with the checks of
    C(kvops validate); the host fails when any check FAILs, with the FAIL findings in the message and all
    findings in C(findings).
  - The probe settings come from the host's variables (C(kvops_role), C(kvops_gds_dir), C(kvops_probe_roots), ...)
    exactly as C(kvops validate) reads them.
  - With O(fail_on_finding=false) the host does not fail here; its FAIL findings are in C(fails) and, as per-host
    custom stats (key C(kvops_gate_fail)), in the play recap when C(show_custom_stats) is on; a later task fails
    the host. Ansible drops the stats of a failed task, so this is how the findings reach the recap.
  - Needs the kvops Python package on the controller.
"""

# host variables the probe settings and options are derived from (kvops.remote.inventory)
_VAR_PREFIXES = ("kvops_", "ansible_host", "ansible_port", "ansible_user")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("storage_bench", "fail_on_finding"))
    # Ansible's own check and conversion of the task's options: `fail_on_finding: "{{ x }}"`
    # templated to the string "False" is the boolean false, and a value that is no boolean
    # fails the task naming the option, instead of counting as true.
    _ARGUMENT_SPEC = {
        "storage_bench": {"type": "bool", "default": False},
        "fail_on_finding": {"type": "bool", "default": True},
    }

    def run(self, tmp: Any = None, task_vars: Any = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        result["changed"] = False
        _, args = self.validate_argument_spec(argument_spec=self._ARGUMENT_SPEC)
        try:
            from kvops import __version__
            from kvops.remote.inventory import (
                InventoryHost,
                probe_options,
                probe_settings,
            )
            from kvops.validate.collect import probe_config
            from kvops.validate.judge import judge
        except ImportError as exc:
            result.update(
                failed=True,
                msg="kvops_gate judges with the kvops Python package on the controller "
                f"(pip install kvops into Ansible's environment): {exc}",
            )
            return result
        name = str(task_vars.get("inventory_hostname"))
        host_vars = {
            k: self._templar.template(v)
            for k, v in task_vars.items()
            if isinstance(k, str) and k.startswith(_VAR_PREFIXES)
        }
        host = InventoryHost(name, vars=host_vars)
        try:
            bench = args["storage_bench"]
            settings = probe_settings(host, bench)
            config = probe_config(host, settings, probe_options(host), 120.0)
        except Exception as exc:  # a host variable kvops cannot read (the message names it)
            result.update(failed=True, msg=f"kvops_gate: {exc}")
            return result
        token = config.pop("http_bearer_token", None)
        module_args: dict[str, Any] = {
            "host": name,
            "config": config,
            "probe_version": __version__,
        }
        if token:
            module_args["http_bearer_token"] = token
        probe = self._execute_module(
            module_name="kvops.gds.kvops_probe", module_args=module_args, task_vars=task_vars
        )
        if probe.get("failed") or probe.get("unreachable") or "evidence" not in probe:
            probe.setdefault("msg", "kvops_probe returned no evidence")
            probe["changed"] = False
            return probe  # type: ignore[no-any-return]
        evidence = {**probe["evidence"], "host": name, "settings": settings}
        findings = judge(evidence)
        rows = [
            {
                "check_id": f.check_id,
                "severity": str(f.severity),
                "title": f.title,
                "message": f.message,
            }
            for f in findings
        ]
        fails = [f"{r['check_id']} {r['title']}: {r['message']}" for r in rows
                 if r["severity"] == "FAIL"]  # fmt: skip
        result["findings"] = rows
        result["fails"] = fails
        if fails:
            result["msg"] = f"{name}: validation FAILed: " + "; ".join(fails)
            if args["fail_on_finding"]:
                result["failed"] = True
            else:  # an ok result: Ansible keeps its stats for the recap (per host)
                result["ansible_stats"] = {
                    "data": {"kvops_gate_fail": fails},
                    "per_host": True,
                    "aggregate": False,
                }
        else:
            warns = sum(1 for r in rows if r["severity"] == "WARN")
            result["msg"] = f"{name}: no FAIL ({len(rows)} findings, {warns} WARN)"
        return result
