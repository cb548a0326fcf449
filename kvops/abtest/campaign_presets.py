"""Campaign presets: one sweep per reference case (`kvops ab-test --sweep-preset NAME`).

Why: the three reference cases (unique one-shot prompts, one resident shared prefix, many long
shared prefixes overflowing GPU memory) are each one point in the workload presets; as
campaigns they show where offload starts to pay (multi-shared-prefix over num_prefixes) and
that it never does when nothing is reused or the reuse fits the GPU. They are data, like the
workload presets: `kvops/workload/presets/campaigns/<name>.yaml`, strict (unknown keys are
errors), each sweep checked as `--sweep` checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

import yaml

from kvops.abtest.campaign import CampaignError, parse_sweep
from kvops.workload.spec import PRESET_NAMES

# One campaign per reference case, named after its workload preset.
CAMPAIGN_PRESETS = PRESET_NAMES
_KEYS = ("name", "description", "scenario", "sweep")


@dataclass(frozen=True)
class CampaignPreset:
    name: str
    description: str
    scenario: str  # a workload preset name
    sweep: str  # PARAM=V1,V2,... as --sweep takes it


def load_campaign_preset(name: str) -> CampaignPreset:
    """The packaged preset `name` (CampaignError: unknown, or a file kvops cannot run)."""
    if name not in CAMPAIGN_PRESETS:
        raise CampaignError(
            f"unknown campaign preset {name!r}; choose one of {', '.join(CAMPAIGN_PRESETS)}"
        )
    source = f"campaign preset {name}"
    text = (
        resources.files("kvops.workload")
        .joinpath(f"presets/campaigns/{name}.yaml")
        .read_text("utf-8")
    )
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or sorted(data) != sorted(_KEYS):
        raise CampaignError(f"{source}: expected exactly the keys {', '.join(_KEYS)}")
    preset = CampaignPreset(**{k: str(data[k]) for k in _KEYS})
    if preset.scenario not in PRESET_NAMES:
        raise CampaignError(f"{source}: scenario {preset.scenario!r} is not a workload preset")
    parse_sweep(preset.sweep)  # CampaignError when the sweep cannot run
    return preset
