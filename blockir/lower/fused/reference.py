"""Pure-PyTorch reference of the fused boundary: forward and analytic backward.

The forward is composed from ``numerics`` and the norm families' math (the same
functions the unfused graph calls), so on CPU the fused op returns exactly
what the unfused graph returns. The backward is written out by hand rather
than taken from autograd so that it needs only what the op saves: the new
residual stream and the row statistics (plus the branch when a branch-scale
gradient is wanted). The dropout mask is regenerated from its key.
"""
from __future__ import annotations

import torch
from torch import Tensor

from blockir.lower.layers import numerics
from blockir.norms.layernorm import layer_norm
from blockir.norms.rmsnorm import rms_norm
from blockir.lower.fused.spec import HALF_DTYPES, BackwardInputs, BoundarySpec, Family, Inputs
from blockir.lower.rng import keep_mask


def branch_update(
    branch: Tensor,
    branch_bias: Tensor | None,
    branch_scale: Tensor | None,
    dropout_key: Tensor | None,
    spec: BoundarySpec,
) -> tuple[Tensor, Tensor]:
    """The update before the cast to the residual dtype, and the dropped branch before scaling.

    The second value is what a branch-scale gradient multiplies by.
    """
    u = branch if branch_bias is None else branch + branch_bias
    dropped = numerics.dropout(u, spec.p, "element", spec.training, dropout_key)
    u = dropped
    if branch_scale is not None:
        u = u * branch_scale
    if spec.branch_scale_const != 1.0:
        u = u * spec.branch_scale_const
    return u, dropped


def residual_add(update: Tensor, residual: Tensor, spec: BoundarySpec) -> Tensor:
    """The new residual stream, in the residual's dtype."""
    shortcut = residual if spec.shortcut_scale == 1.0 else spec.shortcut_scale * residual
    return shortcut + update.to(residual.dtype)


def normalize(residual_out: Tensor, weight: Tensor | None, bias: Tensor | None, spec: BoundarySpec) -> Tensor:
    if spec.family is Family.LAYER:
        y = layer_norm(residual_out, weight, bias, spec.eps, spec.accum)
    else:
        assert weight is not None, "RMSNorm needs a weight"
        y = rms_norm(residual_out, weight, spec.eps, spec.offset, spec.cast, spec.accum)
    return y if spec.out_dtype is None else y.to(spec.out_dtype)


def row_stats(residual_out: Tensor, spec: BoundarySpec) -> tuple[Tensor | None, Tensor]:
    """Per-row ``(mean, rstd)`` in the accumulation dtype, of the leading axes' shape (``[B, S]`` for a
    ``[B, S, D]`` stream); mean is None for RMSNorm."""
    work = residual_out.to(spec.accum)
    if spec.family is Family.LAYER:
        mean = work.mean(-1, keepdim=True)
        variance = (work - mean).pow(2).mean(-1)
        return mean.squeeze(-1), torch.rsqrt(variance + spec.eps)
    return None, torch.rsqrt(work.pow(2).mean(-1) + spec.eps)


def forward(x: Inputs, spec: BoundarySpec) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """``(normalized, residual_out, mean, rstd)``."""
    update, _ = branch_update(x.branch, x.branch_bias, x.branch_scale, x.dropout_key, spec)
    residual_out = residual_add(update, x.residual, spec)
    mean, rstd = row_stats(residual_out, spec)
    return normalize(residual_out, x.weight, x.bias, spec), residual_out, mean, rstd


def _effective_weight(weight: Tensor, spec: BoundarySpec) -> Tensor:
    """The scale the normalized row is multiplied by, rounded where the forward rounds it."""
    if spec.family is Family.RMS and spec.offset:
        # after_weight adds the offset in the accumulation dtype, the other orders in the weight dtype
        w = weight.to(spec.accum) if spec.cast == "after_weight" else weight
        return (spec.offset + w).to(spec.accum)
    return weight.to(spec.accum)


def _weight_operand(x_hat: Tensor, residual_dtype: torch.dtype, weight: Tensor, spec: BoundarySpec) -> Tensor:
    """The tensor the weight multiplies in the forward, i.e. what its gradient is taken against."""
    if spec.family is Family.RMS and spec.cast == "before_weight":
        return x_hat.to(residual_dtype).to(spec.accum)
    if spec.family is Family.RMS and spec.cast == "weight_dtype" and weight.dtype in HALF_DTYPES:
        return x_hat.to(weight.dtype).to(spec.accum)
    return x_hat


def backward(
    t: BackwardInputs, branch_dtype: torch.dtype, spec: BoundarySpec
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """``(d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_branch_scale)``.

    ``branch`` is only read for the branch-scale gradient, which needs the
    dropped branch; without it that gradient is None. Everything is
    accumulated in ``spec.accum`` and cast once at the end.
    """
    residual_out, mean, weight, bias, branch_bias, branch_scale = \
        t.residual_out, t.mean, t.weight, t.bias, t.branch_bias, t.branch_scale
    acc = spec.accum
    shape, width = residual_out.shape, residual_out.shape[-1]
    x = residual_out.reshape(-1, width).to(acc)
    gy = t.grad_normalized.reshape(-1, width).to(acc)
    # statistics of any shape holding one value per row, leading axes kept or flattened
    r = t.rstd.to(acc).reshape(-1, 1)
    x_hat = (x - mean.to(acc).reshape(-1, 1)) * r if mean is not None else x * r

    g_hat = gy if weight is None else gy * _effective_weight(weight, spec)
    gx = g_hat - x_hat * (g_hat * x_hat).mean(-1, keepdim=True)
    if spec.family is Family.LAYER:
        gx = gx - g_hat.mean(-1, keepdim=True)
    g = gx * r
    if t.grad_residual_out is not None:
        g = g + t.grad_residual_out.reshape(-1, width).to(acc)

    d_weight = None
    if weight is not None:
        d_weight = (gy * _weight_operand(x_hat, residual_out.dtype, weight, spec)).sum(0).to(weight.dtype)
    d_bias = gy.sum(0).to(bias.dtype) if bias is not None else None
    d_residual = (g * spec.shortcut_scale).to(residual_out.dtype).reshape(shape)

    d_scale = None
    if branch_scale is not None and t.branch is not None:
        _, dropped = branch_update(t.branch, branch_bias, None, t.dropout_key, spec)
        per_channel = (g * dropped.reshape(-1, width).to(acc)).sum(0) * spec.branch_scale_const
        d_scale = (per_channel if branch_scale.numel() == width else per_channel.sum()).reshape(branch_scale.shape)
        d_scale = d_scale.to(branch_scale.dtype)
    if branch_scale is not None:
        g = g * branch_scale.to(acc).reshape(-1)
    if spec.branch_scale_const != 1.0:
        g = g * spec.branch_scale_const
    if spec.dropout_active:
        keep = keep_mask(t.dropout_key, spec.p, rows=x.shape[0], cols=width, device=x.device)
        g = torch.where(keep, g * spec.keep_scale, 0.0)
    d_branch_bias = g.sum(0).to(branch_bias.dtype) if branch_bias is not None else None
    d_branch = g.to(branch_dtype).reshape(shape)
    return d_branch, d_residual, d_weight, d_bias, d_branch_bias, d_scale

