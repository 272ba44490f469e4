"""Residual telemetry: for every residual add y = x + u, per-row update ratio and alignment.

rho = RMS(u) / (RMS(x) + delta) and c = <x, u> / (|x| |u| + delta), summarised
by quantiles over rows so a few unstable rows are not hidden by a mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from blockir.analyses.sizes import Sizes
from blockir.ir.decls import InstanceDecl
from blockir.ir.ops import AddOp
from blockir.ir.program import Block, Program

DELTA = 1e-12
QUANTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class SiteStats:
    site: str  # SSA name of the add's result, prefixed by its layer path
    rho: tuple[float, ...]  # quantiles of the update ratio over rows
    cos: tuple[float, ...]  # quantiles of the state/update cosine over rows


def residual_sites(program: Program, block: Block, sizes: Sizes, prefix: str = "") -> list[tuple[str, str, str]]:
    """(result, state, update) value paths of every residual add, in execution order, through stacks."""
    sites: list[tuple[str, str, str]] = []
    for op in block.ops:
        decl = block.decl_map.get(getattr(op, "decl", ""))
        if isinstance(op, AddOp):
            sites.append((prefix + op.result, prefix + op.lhs, prefix + op.rhs))
        elif isinstance(decl, InstanceDecl):
            sub = program.block(decl.block)
            if decl.count is None:
                sites += residual_sites(program, sub, sizes, f"{prefix}{decl.name}.")
            else:
                for i in range(int(sizes.value(decl.count))):
                    sites += residual_sites(program, sub, sizes, f"{prefix}{decl.name}.{i}.")
    return sites


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
    for site, state, update in residual_sites(program, block, sizes):
        if state not in values or update not in values:
            continue
        rho, cos = row_stats(values[state], values[update])
        out.append(SiteStats(site, tuple(torch.quantile(rho, q).tolist()), tuple(torch.quantile(cos, q).tolist())))
    return out
