"""Residual telemetry: for every residual update y = x + u, per-row update ratio and alignment.

The sites, and which operand is the shortcut x and which the update u, come
from the residual-structure analysis (:mod:`blockir.analyses.sites`), never
from operand order; a parallel update's u is the sum of its branches.

rho = RMS(u) / (RMS(x) + delta) and c = <x, u> / (|x| |u| + delta), summarised
by quantiles over rows so a few unstable rows are not hidden by a mean.

Method telemetry follows the parameters a method adds: every learned gate on a
branch (ReZero's scalar, LayerScale's vector) with the norm of its last
gradient, and every DyT application with its alpha, its gradient and the
fraction of input elements where |alpha x| > 2, i.e. where tanh has flattened
to under 7% of its slope at zero, with the range of its input and the distribution of its
slope relative to the peak, 1 - tanh²(alpha x) (quantiles over input elements).

Carried attention scores (RealFormer) get their own line per layer: the RMS of
the score state, which grows with depth under a running sum, and the mean
entropy (nats) of the attention each query row takes from it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blockir.analyses.sizes import Sizes
from blockir.analyses.sites import method_sites, residual_sites, score_sites
from blockir.ir.program import Block, Program

DELTA = 1e-12
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class SiteStats:
    site: str  # SSA name of the add's result, prefixed by its layer path
    rho: tuple[float, ...]  # quantiles of the update ratio over rows
    cos: tuple[float, ...]  # quantiles of the state/update cosine over rows


@dataclass(frozen=True)
class ScoreStats:
    site: str  # SSA name of the score state an attention returned, prefixed by its layer path
    rms: float  # root mean square of the score state
    entropy: float  # mean entropy (nats) of the softmax over each query row's allowed keys


def score_stats(scores: torch.Tensor, causal: bool) -> tuple[float, float]:
    s = scores.detach().double()
    if causal:
        queries, keys = s.shape[-2:]
        later = torch.ones(queries, keys, dtype=torch.bool, device=s.device).triu(1 + keys - queries)
        s = s.masked_fill(later, float("-inf"))
    logp = torch.log_softmax(s, dim=-1)
    entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    return scores.detach().double().pow(2).mean().sqrt().item(), entropy.mean().item()


def score_telemetry(program: Program, block: Block, values: dict[str, torch.Tensor], sizes: Sizes) -> list[ScoreStats]:
    """The score state and attention entropy of every score-carrying attention found in a trace."""
    return [ScoreStats(s.site, *score_stats(values[s.site], s.causal))
            for s in score_sites(program, block, sizes) if s.site in values]


def row_stats(state: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = state.detach().double().reshape(-1, state.shape[-1])
    u = update.detach().double().reshape(-1, update.shape[-1])
    xn, un = x.norm(dim=-1), u.norm(dim=-1)
    rho = un / (xn + DELTA)  # RMS ratio: both rows have the same width
    cos = (x * u).sum(-1) / (xn * un + DELTA)
    return rho, cos


def telemetry(program: Program, block: Block, values: dict[str, torch.Tensor], sizes: Sizes) -> list[SiteStats]:
    """Summarise every residual add found in a trace (values from :func:`blockir.trace`)."""
    q = torch.tensor(QUANTILES, dtype=torch.float64)
    out = []
    for site, shortcut, updates in residual_sites(program, block, sizes):
        if shortcut not in values or any(u not in values for u in updates):
            continue
        rho, cos = row_stats(values[shortcut], sum(values[u].double() for u in updates))
        out.append(SiteStats(site, tuple(torch.quantile(rho, q).tolist()), tuple(torch.quantile(cos, q).tolist())))
    return out


# |alpha x| beyond which DyT counts as saturated: tanh(2) = 0.964, and the slope 1 - tanh^2 is 0.071 of its peak
DYT_SATURATION = 2.0


@dataclass(frozen=True)
class MethodStats:
    """One method parameter: a branch gate (ReZero's scalar, LayerScale's vector) or one DyT application."""

    site: str  # the parameter path (a gate) or the DyT module path with the layer path
    kind: str  # gate | dyt
    value: float  # the gate (a vector's mean |g|), or DyT's alpha
    grad_norm: float | None  # L2 norm of the last step's gradient of the gate or alpha (None before any step)
    saturated: float | None = None  # dyt: fraction of input elements with |alpha x| > DYT_SATURATION
    input_range: tuple[float, float] | None = None  # dyt: min and max of the input elements
    slope: tuple[float, ...] | None = None  # dyt: quantiles SLOPE_QUANTILES of 1 - tanh²(alpha x) over elements


SLOPE_QUANTILES = (0.01, 0.5, 0.99)


def dyt_input(alpha: torch.Tensor, x: torch.Tensor) -> tuple[float, tuple[float, float], tuple[float, ...]]:
    """Saturated fraction, input range and slope quantiles of DyT's tanh(alpha x) over the elements of ``x``."""
    ax = alpha.detach().double().reshape(-1)[0] * x.detach().double().reshape(-1)
    slope = 1 - torch.tanh(ax).pow(2)
    xs = x.detach().double()
    q = torch.tensor(SLOPE_QUANTILES, dtype=torch.float64)
    # torch.quantile refuses very large inputs; the slope's distribution is kept to a strided sample of them
    sample = slope[::max(1, slope.numel() // 2 ** 24 + 1)]
    return (float((ax.abs() > DYT_SATURATION).double().mean()), (float(xs.min()), float(xs.max())),
            tuple(torch.quantile(sample, q).tolist()))


def _grad_norm(p: torch.Tensor) -> float | None:
    return float(p.grad.detach().double().norm()) if p.grad is not None else None


def method_telemetry(program: Program, block: Block, module: torch.nn.Module, values: dict[str, torch.Tensor],
                     sizes: Sizes) -> list[MethodStats]:
    """Gate values and DyT alpha and saturation of ``module`` (compiled from ``block``), with the gradients
    the last backward left on them; ``values`` is a trace of ``module``."""
    out = []
    for s in method_sites(program, block, sizes):
        if s.kind == "gate":
            p = module.get_parameter(s.param)
            out.append(MethodStats(s.param, "gate", float(p.detach().double().abs().mean()), _grad_norm(p)))
            continue
        alpha = module.get_parameter(s.param + ".alpha")
        x = values.get(s.value or "")
        saturated, span, slope = dyt_input(alpha, x) if x is not None else (None, None, None)
        out.append(MethodStats(s.param, s.kind, float(alpha.detach().double().reshape(-1)[0]), _grad_norm(alpha),
                               saturated, span, slope))
    return out
