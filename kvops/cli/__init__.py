"""The `kvops` command group. Each command lives in its own module and is added here.

Every command returns an :class:`~kvops.errors.RC` (or None for OK) and raises a
:class:`~kvops.errors.KvopsError` for a command-level failure;
:class:`~kvops.cli.group.KvopsGroup` is the one place that turns both into the exit status and
prints the error's one line.
"""

from __future__ import annotations

import click

from kvops import __version__
from kvops.cli.group import KvopsGroup


@click.group(
    cls=KvopsGroup,
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


# Commands are registered below, one line each, as they land.

from kvops.cli.smoke import smoke  # noqa: E402

main.add_command(smoke)

from kvops.cli.parse import parse  # noqa: E402

main.add_command(parse)

from kvops.cli.validate import validate  # noqa: E402

main.add_command(validate)

from kvops.cli.lab import lab  # noqa: E402

main.add_command(lab)

from kvops.cli.ab_test import ab_test  # noqa: E402

main.add_command(ab_test)

from kvops.cli.sim import sim  # noqa: E402

main.add_command(sim)

from kvops.cli.advise import advise  # noqa: E402

main.add_command(advise)

from kvops.cli.gds import gds  # noqa: E402

main.add_command(gds)

from kvops.cli.explain import explain  # noqa: E402

main.add_command(explain)
