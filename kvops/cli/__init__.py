"""The `kvops` command group. Each command lives in its own module and is added here.

Every command returns an :class:`~kvops.errors.RC` (or None for OK) and raises a
:class:`~kvops.errors.KvopsError` for a command-level failure;
:class:`~kvops.cli.group.KvopsGroup` is the one place that turns both into the exit status and
prints the error's one line.
"""

from __future__ import annotations

import click

from kvops import __version__
from kvops.cli.group import LazyKvopsGroup

# Each command in its own module, imported when it is run (LazyKvopsGroup): one line here as
# each lands.
COMMANDS = {
    "smoke": "kvops.cli.smoke:smoke",
    "parse": "kvops.cli.parse:parse",
    "validate": "kvops.cli.validate:validate",
    "lab": "kvops.cli.lab:lab",
    "ab-test": "kvops.cli.ab_test:ab_test",
    "sim": "kvops.cli.sim:sim",
    "advise": "kvops.cli.advise:advise",
    "gds": "kvops.cli.gds:gds",
    "explain": "kvops.cli.explain:explain",
}


@click.group(
    cls=LazyKvopsGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="kvops")
def main() -> None:
    """Provision, validate and prove KV-cache offload for vLLM + LMCache (GDS) on NetApp ONTAP.

    \b
    Provision   ansible-playbook -i inventories/<env> playbooks/site.yml
    Validate    kvops validate -i inventories/<env>
    Prove       kvops smoke --url URL;  kvops ab-test --arm baseline=URL --arm offload=URL
    Predict     kvops advise TRACE|PRESET;  kvops advise sizing --prefix-tokens T --num-prefixes K
    """
