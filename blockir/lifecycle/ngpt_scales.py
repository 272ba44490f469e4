"""The ranges of nGPT's learned scales: the eigen learning rates α of every update, s_qk and s_z.

nGPT (arXiv:2410.01131) stores each scale at a small value and applies it times a constant, so that Adam
moves it at the rate of the matrices: the effective value is ``factor * stored``. The paper tracks the
effective values — an eigen rate that has gone negative or past 1 overshoots the branch's destination
on the sphere — so that is what is reported, per update and per parameter, as min, max and mean over
the vector's entries.

- α: an update ``x + c₁ * (… (alpha * (t − x)))`` (an interpolation, ``blockir.analyses.structure``)
  scaled by one learned vector and constants; factor = the product of the constants.
- s_qk: an attention declared ``qk_scale=true``; it multiplies q and k by ``qk_scale * sqrt(width)``.
- s_z: the language model's logit scale, applied times ``sqrt(width)`` (``blockir.lifecycle.lm``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from blockir.analyses.block_queries import has, sum_of
from blockir.analyses.sites import executed_ops
from blockir.analyses.sizes import Sizes
from blockir.analyses.structure import interpolation, wrapper
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.traits import Calls


@dataclass(frozen=True)
class ScaleRange:
    """One learned nGPT scale, as applied."""

    site: str  # the update's sum (an eigen rate) or the module path (s_qk, s_z), with its layer path
    kind: str  # eigen_rate | s_qk | s_z
    param: str  # the stored parameter's path
    factor: float  # the applied value is factor * stored
    low: float
    high: float
    mean: float


def scale_range(site: str, kind: str, param: str, stored: torch.Tensor, factor: float) -> ScaleRange:
    applied = stored.detach().double() * factor
    return ScaleRange(site, kind, param, factor, float(applied.min()), float(applied.max()), float(applied.mean()))


def ngpt_scales(program: Program, block: Block, module: nn.Module, sizes: Sizes) -> list[ScaleRange]:
    """The eigen rates of every interpolating update and the s_qk of every attention that ``module`` (compiled
    from ``block``) runs, in execution order."""
    out: list[ScaleRange] = []
    roots: dict[int, dict[int, object]] = {}
    for inner, prefix, op in executed_ops(program, block, sizes):
        if id(inner) not in roots:
            roots[id(inner)] = {id(s.root): s for s in wrapper(inner).sublayers}
        sub = roots[id(inner)].get(id(op))
        decl = inner.decl_map.get(getattr(op, "decl", None) or "")
        if sub is not None and interpolation(inner, sub) is not None:  # type: ignore[arg-type]
            scales = [m for b in sub.branches for m in b.scales]  # type: ignore[attr-defined]
            params = [m.param for m in scales if m.param is not None]
            if len(params) == 1:
                scope = sizes.for_block(inner)
                factor = math.prod(float(scope.value(m.factor)) for m in scales if m.factor is not None)
                path = prefix + params[0]
                out.append(scale_range(prefix + sum_of(op), "eigen_rate", path, module.get_parameter(path), factor))
        elif has(op, Calls) and isinstance(decl, KindDecl) and decl.arg("qk_scale"):
            attention = module.get_submodule(prefix + decl.name)
            out.append(scale_range(prefix + decl.name, "s_qk", prefix + decl.name + ".qk_scale",
                                   attention.qk_scale, attention.width ** 0.5))
    return out
