"""Workloads: strict specs, the three presets, exact-length request generation, schedules,
traces (`trace`: session traces included, read as conversations placed in time; `replay`: their
prompts per trial), and the record of one request as measured (`record`: the load generator
writes it, the metrics read it, neither through the other)."""

from kvops.workload.generate import (
    Alphabet,
    PlannedRequest,
    SampleRequest,
    make_prefixes,
    plan_iteration,
)
from kvops.workload.spec import (
    PRESET_NAMES,
    WorkloadSpec,
    WorkloadSpecError,
    load_preset,
    load_spec_file,
    spec_from_dict,
)

__all__ = [
    "PRESET_NAMES",
    "Alphabet",
    "PlannedRequest",
    "SampleRequest",
    "WorkloadSpec",
    "WorkloadSpecError",
    "load_preset",
    "load_spec_file",
    "make_prefixes",
    "plan_iteration",
    "spec_from_dict",
]
