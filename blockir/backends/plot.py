"""Telemetry plot: update ratio and alignment against depth (matplotlib is an optional extra)."""
from __future__ import annotations

from blockir.backends.telemetry import SiteStats


def plot_sites(sites: list[SiteStats] | tuple[SiteStats, ...], path: str, title: str = "") -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # the extra is optional
        raise SystemExit("blockir: --plot needs matplotlib (pip install 'blockir[plot]')") from exc
    depth = range(len(sites))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for i, label in enumerate(("p50", "p90", "p99")):
        top.plot(depth, [s.rho[i] for s in sites], marker="o", label=f"rho {label}")
        bottom.plot(depth, [s.cos[i] for s in sites], marker="o", label=f"cos {label}")
    top.set_ylabel("RMS(u) / RMS(x)")
    bottom.set_ylabel("cos(x, u)")
    bottom.set_xlabel("residual site")
    bottom.set_xticks(list(depth), [s.site for s in sites], rotation=60, ha="right", fontsize=7)
    top.legend(), bottom.legend()
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
