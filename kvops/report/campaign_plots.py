"""PNG plots of a campaign (`kvops ab-test --sweep`): each arm's total token throughput against
its mean and p99 TTFT, one point per swept value, so the two arms' load-latency curves sit
side by side (matplotlib optional, as for the run plots: a note when it is absent)."""

from __future__ import annotations

from pathlib import Path

from kvops.abtest.campaign import Campaign
from kvops.abtest.result_types import ResultsFormatError, RunResults
from kvops.report.abtest_plots import _save

Curve = dict[str, list[tuple[float, float, float, str]]]  # arm -> (tok/s, mean, p99, label)


def campaign_curves(campaign: Campaign) -> Curve:
    """Per arm, (throughput, mean TTFT, p99 TTFT, point label) of every measured point."""
    curves: Curve = {}
    for p in campaign.points:
        path = Path(p.run_dir) / "results.json"
        try:
            doc = RunResults.from_text(path.read_text(encoding="utf-8"))
        except (OSError, ResultsFormatError):
            continue
        for sc in doc.scenarios.values():
            for arm, block in sc.arms.items():
                m = block.metrics
                if m.total_token_throughput_tok_s and m.mean_ttft_ms and m.p99_ttft_ms:
                    label = campaign.sweep.label(p.value)
                    curves.setdefault(arm, []).append(
                        (m.total_token_throughput_tok_s, m.mean_ttft_ms, m.p99_ttft_ms, label)
                    )
    return curves


def write_campaign_plots(root: Path, campaign: Campaign) -> tuple[list[Path], str | None]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install 'kvops[plots]')"
    curves = campaign_curves(campaign)
    if not curves:
        return [], "plots skipped: no point measured"
    out = root / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for index, kind in ((1, "mean"), (2, "p99")):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for arm, pts in curves.items():
            ax.plot([q[0] for q in pts], [q[index] for q in pts], marker="o", label=arm)
            for q in pts:
                ax.annotate(q[3], (q[0], q[index]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
        ax.set_xlabel("total tokens/s")
        ax.set_ylabel(f"{kind} TTFT (ms)")
        ax.set_title(f"{campaign.spec.name}: throughput vs {kind} TTFT over {campaign.sweep.param}")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(_save(fig, out / f"throughput-vs-{kind}-ttft.png", plt))
    return paths, None
