"""The workload spec reference that `--help` prints, for every command that reads a workload
YAML (`ab-test --workload FILE`, `advise TRACE`).

Why one place: the reference is generated from the spec's field metadata (kvops.schema), so
the help cannot drift from what the strict loader accepts; each command shows the same text.
"""

from __future__ import annotations

from kvops.workload.spec import spec_reference


def workload_reference(given_as: str) -> str:
    """The reference as a click epilog block (`\\b` keeps click from rewrapping it)."""
    return (
        f"\b\nWorkload spec ({given_as}: YAML, strict: unknown keys and bad values are errors):\n"
        + "\n".join("  " + line for line in spec_reference().splitlines())
        + "\n"
    )
