#!/usr/bin/python
# Copyright: kvops contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The kvops probe as an Ansible module: the host's evidence document, read-only.

The probe's code is the collection's module_utils ``probe`` package: links to the very files of
``kvops/probe`` that ``kvops validate`` ships over SSH, so both paths run one collector. Ansible
packs it with this module (Ansiballz,
https://docs.ansible.com/ansible/latest/dev_guide/developing_program_flow_modules.html#ansiballz-framework).
Stdlib only on the target, Python >= 3.8, like the probe.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # noqa: F821 - the module-boilerplate line of Ansible's developer guide

DOCUMENTATION = r"""
---
module: kvops_probe
short_description: Collect the kvops validation evidence of a GPU host
version_added: 0.1.0
description:
  - Runs the kvops probe on the target - files, /proc, sysfs, named system tools, the vLLM service and its HTTP
    endpoints, optionally a short gdsio run - and returns one evidence document (schema_version 1) that
    C(kvops validate --from-evidence) judges.
  - Only reads. Secrets in the service's environment, command line and configuration are redacted on the host,
    before anything is returned.
  - The probe never executes an interpreter, script or path taken from the host's processes or configuration;
    tools are run by name with a clean environment.
options:
  config:
    description:
      - The probe's input, as C(kvops validate) builds it per host from the inventory - C(settings) (what the
        checks expect - C(role), C(vllm_url), C(gds_dir), ...), C(roots) (C(proc), C(sys), C(etc) read from
        other paths), C(tool_dirs), C(command_timeout_s), C(http_timeout_s), C(bench_timeout_s), C(deadline_s).
      - Keys this module sets itself (C(host), C(probe_version), the bearer token) are overwritten.
    type: dict
    default: {}
  host:
    description:
      - The name the evidence document carries; the inventory name, not what the host says it is.
    type: str
    required: true
  probe_version:
    description: The kvops version recorded in the document.
    type: str
    default: unknown
  http_bearer_token:
    description:
      - The vLLM API key (vLLM's C(--api-key)), sent to the service's C(/v1) endpoints only. Never returned.
    type: str
notes:
  - In check mode the probe still reads the host (it changes nothing), but the optional storage bench, which
    writes and removes a scratch file in the GDS directory, is not run; the document says so.
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - kvops contributors
"""

EXAMPLES = r"""
- name: Collect the evidence
  kvops.gds.kvops_probe:
    host: "{{ inventory_hostname }}"
    config:
      settings:
        role: inference
        vllm_url: http://127.0.0.1:8000
  register: probe

- name: Save it for kvops validate --from-evidence DIR
  ansible.builtin.copy:
    content: "{{ probe.evidence | to_nice_json }}"
    dest: "evidence/{{ inventory_hostname }}.json"
    mode: "0600"
  delegate_to: localhost
"""

RETURN = r"""
evidence:
  description: The evidence document (C(schema_version), C(host), C(collected_at), C(probe_version), C(error),
    C(settings), C(items)), as C(python3 -m kvops.probe) prints it.
  returned: always
  type: dict
check_mode_skipped:
  description: What check mode left out (C(storage_bench)), empty otherwise.
  returned: always
  type: list
  elements: str
"""

import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.kvops.gds.plugins.module_utils.probe.main import (
    SCHEMA_VERSION,
    collect,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="dict", default={}),
            host=dict(type="str", required=True),
            probe_version=dict(type="str", default="unknown"),
            http_bearer_token=dict(type="str", no_log=True),
        ),
        supports_check_mode=True,
    )
    config = dict(module.params["config"] or {})
    config.pop("http_bearer_token", None)  # only from the no_log option
    config["host"] = module.params["host"]
    config["probe_version"] = module.params["probe_version"]
    if module.params["http_bearer_token"]:
        config["http_bearer_token"] = module.params["http_bearer_token"]
    skipped = []
    settings = dict(config.get("settings") or {})
    if module.check_mode and settings.get("storage_bench"):
        settings["storage_bench"] = False
        skipped.append("storage_bench")
    config["settings"] = settings
    try:
        document = collect(config)
    except Exception as exc:  # the probe records failures as items; this is a probe bug
        module.fail_json(
            msg="kvops probe failed on the host: %s: %s" % (type(exc).__name__, exc),
            exception=traceback.format_exc(),
            schema_version=SCHEMA_VERSION,
        )
    module.exit_json(changed=False, evidence=document, check_mode_skipped=skipped)


if __name__ == "__main__":
    main()
