"""The fused backend: the fx backend, with a fused add+norm lowered to one custom-op call per boundary.

It reads the ``FUSED_LOWERING`` table before ``FX_LOWERING`` (the fused add+norm kind registers its
entry in ``blockir/ops/fused_add_norm.py``) and extends the fx runtime with :func:`fused_boundary`,
the function that entry's node calls.
"""
from __future__ import annotations

import torch
from torch import nn

from blockir.ir.hooks import FUSED_LOWERING, FX_LOWERING
from blockir.lower.fused import feature_sharded, functional
from blockir.lower.fx.builder import Backend
from blockir.lower.fx.runtime import Runtime
from blockir.lower.layers import numerics
from blockir.lower.rng import dropout_key


def fused_boundary(branch: torch.Tensor, shortcut: torch.Tensor, norm: nn.Module,
                   branch_scale: torch.Tensor | float | None, shortcut_scale: float, p: float,
                   training: bool, seed: torch.Tensor | None, layer: int, site: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalized, residual) of one boundary, with the same dropout identity as the unfused graph."""
    active = training and p > 0.0
    key = dropout_key(seed, layer, site) if active else None
    if active and (numerics.is_dtensor(branch) or numerics.BatchSlice.current[1] > 1):
        # on a slice of the rows the op would key its mask by the slice's rows: numerics keys it by the
        # whole tensor's, as the unsharded run does, and the op adds and normalises the dropped branch
        branch, active = numerics.dropout(branch, p, "element", True, key), False
        key = None
    if feature_sharded.feature_sharded(shortcut):
        return feature_sharded.boundary(branch, shortcut, norm, branch_scale, shortcut_scale)
    common = dict(branch_scale=branch_scale, shortcut_scale=shortcut_scale, p=p if active else 0.0,
                  training=active, dropout_key=key, accum=norm.accum)
    if norm.family.fused_code == "layer":
        return functional.add_layer_norm(branch, shortcut, norm.param("weight"), norm.param("bias"), eps=norm.eps,
                                         **common)
    return functional.add_rms_norm(branch, shortcut, norm.param("weight"), eps=norm.eps, offset=norm.offset, cast=norm.cast,
                                   **common)


class FusedRuntime(Runtime):
    """The fx runtime and the fused boundary."""

    fused_boundary = staticmethod(fused_boundary)


FUSED = Backend("fused", (FUSED_LOWERING, FX_LOWERING), FusedRuntime)
