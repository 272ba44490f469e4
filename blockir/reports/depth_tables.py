"""The depth sections of `blockir run`'s report: the second-moment ledger per residual update, the mean drift
at each norm input, and (``--profile``) the gradient profile by layer and the init statistics."""
from __future__ import annotations

from typing import Any


def moments_table(moments: Any) -> list[str]:
    """One line per residual update y = x + u: RMS of x and y and the terms of E‖y‖²."""
    if not moments:
        return []
    lines = [f"{'site':<28}{'RMS(x)':>10}{'RMS(y)':>10}{'E|x|^2':>12}{'E|u|^2':>12}{'2E[x.u]':>12}{'E|y|^2':>12}"
             f"{'gap':>11}"]
    lines += [f"{m.site:<28}{m.rms_x:>10.4f}{m.rms_y:>10.4f}{m.ex2:>12.5g}{m.eu2:>12.5g}{m.cross:>12.5g}"
              f"{m.ey2:>12.5g}{m.gap:>11.2e}" for m in moments]
    lines.append("means over validation rows; E|y|^2 = E|x|^2 + E|u|^2 + 2E[x.u], gap = measured E|y|^2 minus "
                 "that sum")
    return lines


def moments_json(moments: Any) -> list[dict[str, Any]]:
    return [{"site": m.site, "rms_x": m.rms_x, "rms_y": m.rms_y, "mean_sq_x": m.ex2, "mean_sq_u": m.eu2,
             "cross": m.cross, "mean_sq_y": m.ey2, "gap": m.gap} for m in moments]


def drift_table(drift: Any) -> list[str]:
    """One line per norm application: quantiles over rows of RMS²/(Var+ε) of its input."""
    if not drift:
        return []
    lines = [f"{'norm':<34}{'input':<22}{'eps':>9}{'drift p50':>11}{'drift p90':>11}{'drift p99':>11}"]
    lines += [f"{d.norm:<34}{d.site:<22}{d.eps:>9.1e}" + "".join(f"{v:>11.5f}" for v in d.drift) for d in drift]
    lines.append("drift = RMS(x)^2 / (Var(x) + eps) = 1 + mean^2 / (Var + eps) of the norm's input rows; "
                 "1 for zero-mean rows")
    return lines


def drift_json(drift: Any) -> list[dict[str, Any]]:
    return [{"norm": d.norm, "site": d.site, "eps": d.eps, "drift": list(d.drift)} for d in drift]


def _opt(v: float | None, width: int, spec: str) -> str:
    return f"{v:>{width}{spec}}" if v is not None else f"{'-':>{width}}"


def profile_table(profile: Any) -> list[str]:
    """The gradient norm of each layer at the first and last recorded step, then the init statistics of the
    matrices whose declarations state a spread, one line per weight group over the layers."""
    grads = profile.grads
    lines: list[str] = []
    if grads.steps and grads.layers:
        first, last = grads.steps[0], grads.steps[-1]
        lines.append(f"{'layer':<20}{f'grad step {first}':>16}{f'grad step {last}':>16}")
        lines += [f"{layer:<20}{grads.layer_norms[0][i]:>16.4g}{grads.layer_norms[-1][i]:>16.4g}"
                  for i, layer in enumerate(grads.layers)]
        lines.append(f"L2 norm of each layer's gradient; every step and weight group in --format json "
                     f"({len(grads.groups)} groups)")
    stated = [s for s in profile.init if s.stated is not None]
    groups: dict[tuple[str, str], list[Any]] = {}
    for s in stated:  # one line per weight group: the layers of a stack share declarations
        groups.setdefault((s.param[len(s.layer) + 1:] if s.layer else s.param, s.rule), []).append(s)
    if groups:
        if lines:
            lines.append("")
        lines.append(f"{'weight group':<28}{'layers':>7}{'stated std':>12}{'measured':>10}{'ratio min':>10}"
                     f"{'ratio max':>10}  rule")
        for (group, rule), ss in groups.items():
            ratios = [s.ratio for s in ss if s.ratio is not None]
            want = sorted({round(s.stated, 6) for s in ss})
            shown = f"{want[0]:.4g}" if len(want) == 1 else f"{want[0]:.3g}-{want[-1]:.3g}"
            lines.append(f"{group:<28}{len(ss):>7}{shown:>12}{sum(s.std for s in ss) / len(ss):>10.4g}"
                         f"{_opt(min(ratios, default=None), 10, '.3f')}{_opt(max(ratios, default=None), 10, '.3f')}"
                         f"  {rule}")
    if profile.init:
        lines.append(f"init spread measured on the model as initialised from --seed, per matrix in --format json "
                     f"({len(profile.init) - len(stated)} of {len(profile.init)} state no initialisation)")
    return lines
