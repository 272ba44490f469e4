"""Residual telemetry: for every residual update y = x + u, per-row update ratio and alignment.

The sites, and which operand is the shortcut x and which the update u, come
from the residual-structure analysis (:mod:`blockir.analyses.sites`), never
from operand order; a parallel update's u is the sum of its branches.

rho = RMS(u) / (RMS(x) + delta) and c = <x, u> / (|x| |u| + delta), summarised
by quantiles over rows so a few unstable rows are not hidden by a mean.

Carried attention scores (RealFormer) get their own line per layer: the RMS of
the score state, which grows with depth under a running sum, and the mean
entropy (nats) of the attention each query row takes from it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blockir.analyses.sizes import Sizes
from blockir.analyses.sites import residual_sites, score_sites
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
