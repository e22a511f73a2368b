"""The plot of a tune: predicted against measured speedup over the DDP default, with each prediction's interval."""
from __future__ import annotations

from pathlib import Path

from autosync.search.result import TuneResult


def plot_predicted_vs_measured(result: TuneResult, path: str | Path) -> None:
    """One point per measured strategy (red: the tune's proposals, blue: references and baselines), a line for its
    calibrated interval, and the diagonal where prediction and measurement agree."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(m.predicted_speedup, m.confirmed_samples_per_s / result.default_samples_per_s, m.source,
            m.predicted_interval) for m in result.measured if m.status == "ok" and result.default_samples_per_s]
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for pred, meas, source, iv in pts:
        color = "tab:red" if source == "tune" else "tab:blue"
        if iv:   # the calibrated 80% interval of the prediction
            ax.plot(iv, [meas, meas], color=color, lw=1, alpha=0.5)
        ax.scatter(pred, meas, c=color, s=30)
        ax.annotate(source, (pred, meas), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if pts:
        lo = min(min(p[0] for p in pts), min(p[1] for p in pts), *(p[3][0] for p in pts if p[3])) * 0.9
        hi = max(max(p[0] for p in pts), max(p[1] for p in pts), *(p[3][1] for p in pts if p[3])) * 1.1
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speedup over DDP default (line: 80% interval)")
    ax.set_ylabel("measured speedup over DDP default")
    ax.set_title("autosync tune: predicted vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
