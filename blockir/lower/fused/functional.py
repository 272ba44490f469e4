"""Keyword-argument front ends of the fused ops, returning ``(normalized, residual_out)``.

They accept a float or a tensor ``branch_scale`` and an int or a 0-d tensor
dropout key, and drop the row statistics that the ops return only for
autograd's sake.
"""
from __future__ import annotations

import torch
from torch import Tensor

from blockir.lower.fused.ops import LAYER_TENSORS, RMS_TENSORS  # importing ops registers torch.ops.blockir.*
from blockir.lower.fused.spec import Inputs


def split_scale(branch_scale: Tensor | float | None) -> tuple[Tensor | None, float]:
    if branch_scale is None or isinstance(branch_scale, Tensor):
        return branch_scale, 1.0
    return None, float(branch_scale)


def _key(dropout_key: Tensor | int | None, device: torch.device) -> Tensor | None:
    if dropout_key is None or isinstance(dropout_key, Tensor):
        return dropout_key
    return torch.tensor(int(dropout_key), dtype=torch.int64, device=device)


def _tensors(x: Inputs, names: tuple[str, ...]) -> tuple[Tensor | None, ...]:
    return tuple(getattr(x, name) for name in names)


def add_layer_norm(
    branch: Tensor,
    residual: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    *,
    eps: float = 1e-5,
    branch_bias: Tensor | None = None,
    branch_scale: Tensor | float | None = None,
    shortcut_scale: float = 1.0,
    p: float = 0.0,
    training: bool = False,
    dropout_key: Tensor | int | None = None,
    out_dtype: torch.dtype | None = None,
    accum: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """``(layer_norm(residual_out), residual_out)``, see ``docs/fused.md``."""
    scale, scale_const = split_scale(branch_scale)
    x = Inputs(branch, residual, weight, bias, branch_bias, scale, _key(dropout_key, branch.device))
    normalized, residual_out, _, _ = torch.ops.blockir.add_layer_norm(
        *_tensors(x, LAYER_TENSORS), eps, p, training, scale_const, shortcut_scale, out_dtype, accum,
    )
    return normalized, residual_out


def add_rms_norm(
    branch: Tensor,
    residual: Tensor,
    weight: Tensor,
    *,
    eps: float = 1e-6,
    offset: int = 0,
    cast: str = "before_weight",
    branch_bias: Tensor | None = None,
    branch_scale: Tensor | float | None = None,
    shortcut_scale: float = 1.0,
    p: float = 0.0,
    training: bool = False,
    dropout_key: Tensor | int | None = None,
    out_dtype: torch.dtype | None = None,
    accum: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """``(rms_norm(residual_out), residual_out)``, see ``docs/fused.md``."""
    scale, scale_const = split_scale(branch_scale)
    x = Inputs(branch, residual, weight, None, branch_bias, scale, _key(dropout_key, branch.device))
    normalized, residual_out, _ = torch.ops.blockir.add_rms_norm(
        *_tensors(x, RMS_TENSORS), eps, offset, cast, p, training, scale_const, shortcut_scale, out_dtype, accum,
    )
    return normalized, residual_out
