"""Run plots: loss against step, the update ratio and alignment against depth, and the measures of the
methods a block uses (matplotlib is optional)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Mapping

from blockir.lifecycle.atomic import write_file
from blockir.lifecycle.session import RunReport
from blockir.norms.dyt import FAMILY as DYT


PLOT_HINT = "blockir: --plot needs matplotlib (pip install 'blockir[plot]')"


def require_matplotlib() -> None:
    """Stop before any work when a plot is asked for and matplotlib is missing."""
    _pyplot()


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # the extra is optional
        raise SystemExit(PLOT_HINT) from exc
    return plt


def _plot_methods(ax, reports: Mapping[str, RunReport]) -> None:  # type: ignore[no-untyped-def]
    """By depth, at the last evaluation: gate values and DyT alpha (solid), DyT saturation (dashed), the RMS and
    attention entropy of carried score states (dotted), and nGPT's applied eigen rates, mean with min–max bars."""
    for label, r in reports.items():
        last = r.snapshots[-1] if r.snapshots else None
        methods = last.methods if last else ()
        for kind in ("gate", DYT.name):
            ms = [m for m in methods if m.kind == kind]
            if ms:
                ax.plot(range(len(ms)), [m.value for m in ms], "o-",
                        label=f"{label} {'gate |g|' if kind == 'gate' else 'DyT alpha'}")
        dyt = [m for m in methods if m.kind == DYT.name and m.saturated is not None]
        if dyt:
            ax.plot(range(len(dyt)), [m.saturated for m in dyt], "x--", label=f"{label} DyT saturated (|alpha x| > 2)")
        rates = [x for x in (last.scales if last else ()) if x.kind == "eigen_rate"]
        if rates:
            means = [x.mean for x in rates]
            bars = [[m - x.low for m, x in zip(means, rates)], [x.high - m for m, x in zip(means, rates)]]
            ax.errorbar(range(len(rates)), means, yerr=bars, fmt="v-.", capsize=2,
                        label=f"{label} nGPT eigen rate (min–max)")
        scores = last.scores if last else ()
        if scores:
            ax.plot(range(len(scores)), [s.rms for s in scores], "s:", label=f"{label} score state RMS")
            ax.plot(range(len(scores)), [s.entropy for s in scores], "d:", label=f"{label} attention entropy (nats)")
    ax.set_ylabel("method measures")
    ax.set_xlabel("gate / DyT site / score state (depth)")


def _plot_states(ax, reports: Mapping[str, RunReport]) -> None:  # type: ignore[no-untyped-def]
    """Against step: nGPT's distance from the unit sphere (hidden rows, projected matrices) and each PRepBN's
    LayerNorm share gamma(t)."""
    for label, r in reports.items():
        steps = [s.step for s in r.snapshots]
        if any(s.sphere is not None for s in r.snapshots):
            for i, what in enumerate(("max |‖h‖ − 1| (hidden rows)", "max |‖w‖ − 1| (projected)")):
                ax.plot(steps, [s.sphere[i] if s.sphere is not None else float("nan") for s in r.snapshots], "o-",
                        label=f"{label} {what}")
        names = [n.name for n in (r.snapshots[-1].norms if r.snapshots else ()) if n.gamma is not None]
        for name in names:
            gamma = [next((n.gamma for n in s.norms if n.name == name), float("nan")) for s in r.snapshots]
            ax.plot(steps, gamma, "^--", label=f"{label} {name} gamma(t)")
    ax.set_xlabel("step")
    ax.set_ylabel("method state")


def _panels(reports: Mapping[str, RunReport]) -> tuple[bool, bool]:
    """Whether the runs have measures by depth (gates, DyT, scores, eigen rates) and states over steps (sphere,
    gamma)."""
    lasts = [r.snapshots[-1] for r in reports.values() if r.snapshots]
    depth = any(s.methods or s.scores or s.scales for s in lasts)
    steps = any(s.sphere is not None or any(n.gamma is not None for n in s.norms) for s in lasts)
    return depth, steps


def _plot_profile(ax, profile: Any) -> None:  # type: ignore[no-untyped-def]
    """The gradient norm of each layer against depth, one line per recorded step (earlier steps faded)."""
    grads = profile.grads
    depth = range(len(grads.layers))
    for i, (step, norms) in enumerate(zip(grads.steps, grads.layer_norms)):
        last = i == len(grads.steps) - 1
        ax.plot(depth, norms, color="C3", alpha=1.0 if last or i == 0 else 0.2, marker="o" if last else None,
                linestyle="--" if i == 0 and not last else "-",
                label=f"step {step}" if last or i == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("layer (depth)")
    ax.set_ylabel("gradient L2 norm per layer")


def plot_run(reports: Mapping[str, RunReport], path: str, title: str = "", profile: Any = None) -> None:
    """One figure for one run or several side by side (``compare``): loss, rho and cos, and with a
    ``profile`` (:class:`blockir.lifecycle.profile.DepthProfile`) the gradient norm per layer.

    For a single run, the telemetry of every evaluation is drawn faded under the last one,
    so the drift of the update ratio during training is visible by depth.
    """
    plt = _pyplot()
    by_depth, over_steps = _panels(reports)
    with_profile = profile is not None and bool(profile.grads.steps) and bool(profile.grads.layers)
    rows = 3 + by_depth + over_steps + with_profile
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3.3 * rows))
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
    if by_depth:
        _plot_methods(axes[3], reports)
    if over_steps:
        _plot_states(axes[3 + by_depth], reports)
    if with_profile:
        _plot_profile(axes[-1], profile)
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
    image = io.BytesIO()
    fig.savefig(image, dpi=110, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    write_file(path, image.getvalue())  # a figure half written by an interrupt never replaces the old one
