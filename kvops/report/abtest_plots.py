"""PNG plots for the ab-test report: TTFT CDF and ITL CDF per arm, per-batch throughput.

matplotlib is an optional extra (`kvops[plots]`): it is imported only here, only when plots are
written, and its absence turns into a note in the report rather than a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvops.abtest.result_types import RunResults
from kvops.workload.record import RequestRecord


def write_plots(
    out_dir: Path, doc: RunResults, measured: dict[str, dict[str, list[RequestRecord]]]
) -> tuple[list[Path], str | None]:
    """Plot files written, and a note when plotting was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install 'kvops[plots]')"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for scenario, arms in measured.items():
        for kind in ("ttft", "itl"):
            fig, ax = plt.subplots(figsize=(6, 3.6))
            for arm, recs in arms.items():
                ok = [r for r in recs if r.ok]
                vals = [r.ttft_ms for r in ok if r.ttft_ms is not None] if kind == "ttft" else [
                    g for r in ok for g in r.itls_ms
                ]  # fmt: skip
                if vals:
                    xs = np.sort(np.asarray(vals))
                    ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=arm)
            ax.set_xlabel(f"{kind.upper()} (ms)")
            ax.set_ylabel("fraction of " + ("requests" if kind == "ttft" else "gaps"))
            ax.set_title(f"{scenario}: {kind.upper()} CDF")
            ax.grid(alpha=0.3)
            ax.legend()
            paths.append(_save(fig, out_dir / f"{scenario}-{kind}-cdf.png", plt))
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for arm, block in doc.scenarios[scenario].arms.items():
            ys = [b.figures.total_token_throughput_tok_s or 0.0 for b in block.per_batch]
            ax.plot(range(1, len(ys) + 1), ys, marker="o", label=arm)
        ax.set_xlabel("batch (in send order, warm-up included)")
        ax.set_ylabel("total tokens/s")
        ax.set_title(f"{scenario}: per-batch throughput")
        ax.grid(alpha=0.3)
        ax.legend()
        paths.append(_save(fig, out_dir / f"{scenario}-batch-throughput.png", plt))
    return paths, None


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
