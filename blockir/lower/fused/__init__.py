"""Fused residual boundary: ``branch -> dropout -> scale -> + residual -> norm`` in one op.

Importing this package registers ``torch.ops.blockir.add_layer_norm``,
``torch.ops.blockir.add_rms_norm`` and ``torch.ops.blockir.add_norm_backward``.
The ABI (argument order, outputs, dtypes, saved state, dropout identity) is
described in ``docs/fused.md``.
"""
from __future__ import annotations

from blockir.lower.fused.functional import add_layer_norm, add_rms_norm
from blockir.lower.fused.ops import cpu_kernels
from blockir.lower.fused.spec import BoundarySpec

__all__ = ["BoundarySpec", "add_layer_norm", "add_rms_norm", "cpu_kernels"]
