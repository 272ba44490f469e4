"""Second moments of every residual update, and the mean drift at the input of every norm.

For an update ``y = x + u`` (x the shortcut operand, u the sum of the branch
operands, as :mod:`blockir.analyses.sites` finds them), over the population of
token rows:

    E‖y‖² = E‖x‖² + E‖u‖² + 2 E[xᵀu]

The cross term is what an independence argument drops; measuring it says how
far the branches are correlated with the state they read. RMS(v) is over every
element, sqrt(E‖v‖² / d). ``gap`` is E‖y‖² measured on the stream value minus
the right-hand side: rounding only, unless the sum scales its operands (a fused
add+norm with ``shortcut_scale``/``branch_scale``), where y is not x + u.

At a norm's input, with the row mean μ, the biased row variance Var and the
norm's ε (0 for a norm that has none), the RMS of a row (ε under the root)
and the centred denominator satisfy RMS² = Var + ε + μ², so

    drift = RMS² / (Var + ε) = 1 + μ² / (Var + ε)

is 1 for a zero-mean row and grows with the row's mean against its spread:
how far RMSNorm and LayerNorm of that row differ. It is summarised by quantiles
over rows, over the last axis (the axis every norm here reduces).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blockir.analyses.block_queries import norm_decl
from blockir.analyses.sites import executed_ops, residual_sites
from blockir.analyses.sizes import Sizes
from blockir.ir.traits import Normalizes
from blockir.ir.program import Block, Program
from blockir.lifecycle.telemetry import DELTA, QUANTILES


@dataclass(frozen=True)
class SiteMoments:
    site: str  # the stream value after the add, with its layer path
    rms_x: float  # RMS of the shortcut operand
    rms_y: float  # RMS of the stream value after the add
    ex2: float  # E‖x‖² over rows
    eu2: float  # E‖u‖² over rows
    cross: float  # 2 E[xᵀu] over rows
    ey2: float  # E‖y‖² over rows, measured on the stream value

    @property
    def gap(self) -> float:
        """E‖y‖² minus E‖x‖² + E‖u‖² + 2E[xᵀu]."""
        return self.ey2 - (self.ex2 + self.eu2 + self.cross)


@dataclass(frozen=True)
class NormDrift:
    site: str  # the norm's input value, with its layer path
    norm: str  # the norm declaration applied to it, with its layer path
    eps: float  # the ε the ratio uses: the norm's own
    drift: tuple[float, ...]  # quantiles over rows of RMS² / (Var + ε)


def _rows(v: torch.Tensor) -> torch.Tensor:
    return v.detach().double().reshape(-1, v.shape[-1])


def moments(x: torch.Tensor, u: torch.Tensor, y: torch.Tensor) -> tuple[float, ...]:
    """(RMS(x), RMS(y), E‖x‖², E‖u‖², 2E[xᵀu], E‖y‖²) over the rows of three tensors of one width."""
    x, u, y = _rows(x), _rows(u), _rows(y)
    ex2, eu2, ey2 = (v.pow(2).sum(-1).mean() for v in (x, u, y))
    cross = 2 * (x * u).sum(-1).mean()
    d = x.shape[-1]
    return tuple(float(t) for t in ((ex2 / d).sqrt(), (ey2 / d).sqrt(), ex2, eu2, cross, ey2))


def drift(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS² / (Var + ε) of every row of ``x``, written 1 + μ²/(Var + ε) so no large terms are subtracted."""
    rows = _rows(x)
    mean = rows.mean(-1)
    var = (rows - mean[:, None]).pow(2).mean(-1)
    return 1 + mean.pow(2) / (var + eps).clamp_min(DELTA)  # a constant row of a norm without ε stays finite


def site_moments(program: Program, block: Block, values: dict[str, torch.Tensor], sizes: Sizes) -> list[SiteMoments]:
    """The second-moment ledger of every residual add found in a trace (values from :func:`blockir.trace`)."""
    out = []
    for site, shortcut, updates in residual_sites(program, block, sizes):
        if site not in values or shortcut not in values or any(u not in values for u in updates):
            continue
        u = sum(values[v].double() for v in updates)
        out.append(SiteMoments(site, *moments(values[shortcut], u, values[site])))  # type: ignore[arg-type]
    return out


def norm_drift(program: Program, block: Block, values: dict[str, torch.Tensor], sizes: Sizes) -> list[NormDrift]:
    """The mean drift of the input of every norm application found in a trace, in execution order."""
    q = torch.tensor(QUANTILES, dtype=torch.float64)
    out = []
    scopes: dict[tuple[int, str], Sizes] = {}
    for inner, prefix, op in executed_ops(program, block, sizes):
        if not op.has(Normalizes):
            continue
        source = op.norm_input()  # type: ignore[attr-defined]
        decl = norm_decl(inner, op)
        if source is None or prefix + source not in values or decl is None:
            continue
        given = decl.arg("eps")
        scope = scopes.setdefault((id(inner), prefix), sizes.for_block(inner))
        eps = float(scope.value(given)) if given is not None else 0.0
        ratio = drift(values[prefix + source], eps)
        out.append(NormDrift(prefix + source, prefix + op.decl, eps,  # type: ignore[attr-defined]
                             tuple(torch.quantile(ratio, q).tolist())))
    return out
