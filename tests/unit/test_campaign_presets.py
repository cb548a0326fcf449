"""Campaign presets (`kvops ab-test --sweep-preset NAME`): one per reference case, each a
workload preset and a sweep that runs as written (issue 27)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvops.abtest.campaign import CampaignError, parse_sweep, point_spec
from kvops.abtest.campaign_presets import CAMPAIGN_PRESETS, load_campaign_preset
from kvops.cli.ab_test import ab_test
from kvops.workload.spec import PRESET_NAMES, load_preset

pytestmark = pytest.mark.unit


def test_every_reference_case_has_a_campaign_whose_points_run() -> None:
    assert set(CAMPAIGN_PRESETS) == set(PRESET_NAMES)
    for name in CAMPAIGN_PRESETS:
        preset = load_campaign_preset(name)
        sweep = parse_sweep(preset.sweep)
        for value in sweep.values:  # every point a valid workload, also shrunk for the demo
            point_spec(load_preset(preset.scenario), sweep, value).scaled(0.02)


def test_the_multi_prefix_campaign_spans_the_gpu_capacity() -> None:
    preset = load_campaign_preset("multi-shared-prefix")
    assert parse_sweep(preset.sweep).values == (5, 10, 15, 20, 30, 40)
    with pytest.raises(CampaignError, match="unknown campaign preset"):
        load_campaign_preset("nope")


def test_a_preset_excludes_a_hand_written_sweep() -> None:
    got = CliRunner().invoke(
        ab_test, ["--sweep-preset", "multi-shared-prefix", "--sweep", "rate=1,2"]
    )
    assert got.exit_code == 2 and "--sweep-preset sets the workload and the sweep" in got.output
