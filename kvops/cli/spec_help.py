"""The spec references that `--help` prints: the workload spec for every command that reads a
workload YAML (`ab-test --workload FILE`, `advise TRACE`), the test package list for `lab up`.

Why one place: each reference is generated from its spec's field metadata (kvops.schema), so
the help cannot drift from what the strict loader accepts; each command shows the same text.
"""

from __future__ import annotations

from kvops.lab.aptrepo import package_list_reference
from kvops.workload.spec import spec_reference


def workload_reference(given_as: str) -> str:
    """The reference as a click epilog block (`\\b` keeps click from rewrapping it)."""
    return (
        f"\b\nWorkload spec ({given_as}: YAML, strict: unknown keys and bad values are errors):\n"
        + "\n".join("  " + line for line in spec_reference().splitlines())
        + "\n"
    )


def package_list_reference_epilog() -> str:
    return (
        "\b\nPackage list (--packages FILE: YAML, strict: unknown keys and bad values are "
        "errors):\n"
        + "\n".join("  " + line for line in package_list_reference().splitlines())
        + "\n"
    )
