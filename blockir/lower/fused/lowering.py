"""fx lowering of FusedAddNormOp: one call of torch.ops.blockir.add_{layer,rms}_norm per boundary."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn

from blockir.lower.fused import functional
from blockir.lower.fx import EXTRA_LOWERINGS, GraphBuilder, node_name, site_id
from blockir.lower.rng import dropout_key
from blockir.ops import FusedAddNormOp


def fused_boundary(branch: torch.Tensor, shortcut: torch.Tensor, norm: nn.Module,
                   branch_scale: torch.Tensor | float | None, shortcut_scale: float, p: float,
                   training: bool, seed: torch.Tensor | None, layer: int, site: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, residual) of one boundary, with the same dropout identity as the unfused graph."""
    active = training and p > 0.0
    key = dropout_key(seed, layer, site) if active else None
    common = dict(branch_scale=branch_scale, shortcut_scale=shortcut_scale, p=p if active else 0.0,
                  training=active, dropout_key=key, accum=norm.accum)
    if norm.family.fused_code == "layer":
        return functional.add_layer_norm(branch, shortcut, norm.param("weight"), norm.param("bias"), eps=norm.eps,
                                         **common)
    return functional.add_rms_norm(branch, shortcut, norm.param("weight"), eps=norm.eps, offset=norm.offset, cast=norm.cast,
                                   **common)


def lower_fused(b: GraphBuilder, op: FusedAddNormOp) -> fx.Node:
    p = float(b.value(op.p)) if op.p is not None else 0.0
    if op.branch_param is not None:
        scale: fx.Node | float | None = b.attr(op.branch_param)
    else:
        scale = float(b.value(op.branch_factor)) if op.branch_factor is not None else None
    shortcut_scale = float(b.value(op.shortcut_factor)) if op.shortcut_factor is not None else 1.0
    seed = b.seed_node() if p > 0.0 else None
    site = site_id(op.site) if op.site is not None else 0
    pair = b.fn(fused_boundary, (b.env[op.branch], b.env[op.shortcut], b.attr(op.decl), scale, shortcut_scale, p,
                                 b.training_flag(), seed, b.layer_index(), site))
    for index, ssa in enumerate(op.results):
        b.bind(ssa, b.graph.create_node("call_function", operator.getitem, (pair, index), {}, name=node_name(ssa)))
    return pair


EXTRA_LOWERINGS[FusedAddNormOp] = lower_fused
