"""Residual telemetry: for every residual update y = x + u, per-row update ratio and alignment.

The sites, and which operand is the shortcut x and which the update u, come
from the residual-structure analysis (:mod:`blockir.analyses.sites`), never
from operand order; a parallel update's u is the sum of its branches.

rho = RMS(u) / (RMS(x) + delta) and c = <x, u> / (|x| |u| + delta), summarised
by quantiles over rows so a few unstable rows are not hidden by a mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blockir.analyses.sizes import Sizes
from blockir.analyses.sites import residual_sites
from blockir.ir.program import Block, Program

DELTA = 1e-12
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class SiteStats:
    site: str  # SSA name of the add's result, prefixed by its layer path
    rho: tuple[float, ...]  # quantiles of the update ratio over rows
    cos: tuple[float, ...]  # quantiles of the state/update cosine over rows


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
