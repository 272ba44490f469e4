"""Run plots: loss against step, and the update ratio and alignment against depth (matplotlib is optional)."""
from __future__ import annotations

from typing import Mapping

from blockir.backends.session import RunReport


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # the extra is optional
        raise SystemExit("blockir: --plot needs matplotlib (pip install 'blockir[plot]')") from exc
    return plt


def _plot_methods(ax, reports: Mapping[str, RunReport]) -> None:  # type: ignore[no-untyped-def]
    """Gate values and DyT alpha by depth (solid), DyT saturation (dashed), at the last evaluation."""
    for label, r in reports.items():
        methods = r.snapshots[-1].methods if r.snapshots else ()
        for kind in ("gate", "dyt"):
            ms = [m for m in methods if m.kind == kind]
            if ms:
                ax.plot(range(len(ms)), [m.value for m in ms], "o-",
                        label=f"{label} {'gate |g|' if kind == 'gate' else 'DyT alpha'}")
        dyt = [m for m in methods if m.kind == "dyt" and m.saturated is not None]
        if dyt:
            ax.plot(range(len(dyt)), [m.saturated for m in dyt], "x--", label=f"{label} DyT saturated (|alpha x| > 2)")
    ax.set_ylabel("method parameters")
    ax.set_xlabel("gate / DyT site (depth)")


def plot_run(reports: Mapping[str, RunReport], path: str, title: str = "") -> None:
    """One figure for one run or several side by side (``compare``): loss, rho and cos.

    For a single run, the telemetry of every evaluation is drawn faded under the last one,
    so the drift of the update ratio during training is visible by depth.
    """
    plt = _pyplot()
    methods = any(r.snapshots and r.snapshots[-1].methods for r in reports.values())
    fig, axes = plt.subplots(4 if methods else 3, 1, figsize=(9, 13 if methods else 10))
    loss, rho, cos = axes[:3]
    for label, r in reports.items():
        steps = range(r.first_step + 1, r.first_step + len(r.losses) + 1)
        line, = loss.plot(steps, r.losses, label=f"{label} train")
        loss.plot([s.step for s in r.snapshots], [s.val_loss for s in r.snapshots], "o--", color=line.get_color(),
                  label=f"{label} validation")
        history = r.snapshots if len(reports) == 1 else r.snapshots[-1:]
        for i, snap in enumerate(history):
            last = i == len(history) - 1
            depth = range(len(snap.sites))
            style = dict(color=line.get_color(), alpha=1.0 if last else 0.25, marker="o" if last else None)
            tag = f"{label} step {snap.step}" if last else None
            rho.plot(depth, [s.rho[0] for s in snap.sites], label=tag, **style)
            cos.plot(depth, [s.cos[0] for s in snap.sites], label=tag, **style)
    if methods:
        _plot_methods(axes[3], reports)
    loss.set_xlabel("step")
    loss.set_ylabel("loss (nats/byte)")
    rho.set_ylabel("rho p50 = RMS(u)/RMS(x)")
    rho.set_yscale("log")
    cos.set_ylabel("cos(x, u) p50")
    cos.set_xlabel("residual site (depth)")
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    loss.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
