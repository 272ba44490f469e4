"""What one fused residual boundary computes, and in which dtypes.

The boundary is

    update       = branch (+ branch_bias) -> dropout -> * branch_scale -> * branch_scale_const
    residual_out = update.to(residual.dtype) + shortcut_scale * residual
    normalized   = norm(residual_out)            (then .to(out_dtype) when given)

Every step rounds to the dtype that eager PyTorch would give it, so the
reference, the Triton kernels and the unfused graph agree on where a bf16
value is rounded. The rules live here so the reference, the fake tensors
and the kernel launchers cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, get_type_hints

import torch
from torch import Tensor

from blockir.norms.rmsnorm import CASTS as CAST_ORDERS

HALF_DTYPES = (torch.float16, torch.bfloat16)


class Family(str, Enum):
    """The norm families a boundary can end in; the value is what the ops' ``family`` argument carries."""

    LAYER = "layernorm"
    RMS = "rmsnorm"


class Inputs(NamedTuple):
    """The tensors one boundary reads, in the order of every forward signature (the ops' ABI)."""

    branch: Tensor
    residual: Tensor
    weight: Tensor | None
    bias: Tensor | None
    branch_bias: Tensor | None
    branch_scale: Tensor | None
    dropout_key: Tensor | None


class BackwardInputs(NamedTuple):
    """The eleven tensors of the shared backward, in the order of every backward signature: the gradients
    of the two outputs, then what the forward saved for it (``SAVED``)."""

    grad_normalized: Tensor
    grad_residual_out: Tensor | None
    residual_out: Tensor
    mean: Tensor | None
    rstd: Tensor
    branch: Tensor | None
    weight: Tensor | None
    bias: Tensor | None
    branch_bias: Tensor | None
    branch_scale: Tensor | None
    dropout_key: Tensor | None


# what autograd keeps from the forward, in this order: the new stream, its row statistics, the inputs
SAVED = BackwardInputs._fields[2:]
# the inputs an op's backward returns gradients for, in order; the dropout key has none
DIFFERENTIABLE = Inputs._fields[:-1]


def required(tensors: type[tuple]) -> frozenset[str]:
    """The fields of ``Inputs`` or ``BackwardInputs`` that are never None."""
    return frozenset(name for name, hint in get_type_hints(tensors).items() if hint is Tensor)


@dataclass(frozen=True)
class BoundarySpec:
    """The static (non-tensor) part of one fused boundary."""

    family: Family
    eps: float
    offset: int = 0
    cast: str = "before_weight"
    p: float = 0.0
    training: bool = False
    branch_scale_const: float = 1.0
    shortcut_scale: float = 1.0
    out_dtype: torch.dtype | None = None
    accum: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "family", Family(self.family))  # the enum, from its value too
        except ValueError:
            raise ValueError(f"unknown norm family {self.family!r}; expected one of "
                             f"{tuple(f.value for f in Family)}") from None
        if self.cast not in CAST_ORDERS:
            raise ValueError(f"unknown RMSNorm cast order {self.cast!r}; expected one of {CAST_ORDERS}")
        if self.offset not in (0, 1):
            raise ValueError(f"RMSNorm weight offset must be 0 or 1, got {self.offset}")
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"dropout probability must lie in [0, 1), got {self.p}")
        if self.eps <= 0.0:
            raise ValueError(f"eps must be positive, got {self.eps}")

    @property
    def dropout_active(self) -> bool:
        return self.training and self.p > 0.0

    @property
    def keep_scale(self) -> float:
        """Factor applied to kept elements (inverted dropout)."""
        return 1.0 / (1.0 - self.p)


def update_dtypes(
    branch_dtype: torch.dtype, branch_bias: Tensor | None, branch_scale: Tensor | None
) -> tuple[torch.dtype, torch.dtype]:
    """Dtypes of the update after the bias add (and dropout), and after the scale multiply."""
    biased = branch_dtype if branch_bias is None else torch.promote_types(branch_dtype, branch_bias.dtype)
    scaled = biased if branch_scale is None else torch.promote_types(biased, branch_scale.dtype)
    return biased, scaled


def norm_dtype(spec: BoundarySpec, residual_dtype: torch.dtype, weight_dtype: torch.dtype | None) -> torch.dtype:
    """Dtype the norm produces before any ``out_dtype`` cast (mirrors ``numerics``)."""
    if spec.family is Family.LAYER or weight_dtype is None:
        return residual_dtype
    if spec.cast == "before_weight":
        return torch.promote_types(weight_dtype, residual_dtype)
    if spec.cast == "after_weight":
        return residual_dtype
    # weight_dtype: x * rsqrt(accum statistic) promotes to accum, then a half weight pulls it down
    scaled = weight_dtype if weight_dtype in HALF_DTYPES else torch.promote_types(residual_dtype, spec.accum)
    return torch.promote_types(weight_dtype, scaled)


def output_dtype(spec: BoundarySpec, residual_dtype: torch.dtype, weight_dtype: torch.dtype | None) -> torch.dtype:
    return spec.out_dtype if spec.out_dtype is not None else norm_dtype(spec, residual_dtype, weight_dtype)


def check_inputs(spec: BoundarySpec, x: Inputs) -> None:
    """Reject shapes and combinations the boundary does not define, naming the argument."""
    branch, residual = x.branch, x.residual
    if branch.shape != residual.shape:
        raise ValueError(f"branch {tuple(branch.shape)} and residual {tuple(residual.shape)} must have the same shape")
    if branch.dim() == 0:
        raise ValueError("branch and residual need a channel axis")
    width = branch.shape[-1]
    for name in ("weight", "bias", "branch_bias"):
        t = getattr(x, name)
        if t is not None and tuple(t.shape) != (width,):
            raise ValueError(f"{name} must have shape ({width},), got {tuple(t.shape)}")
    if x.branch_scale is not None and x.branch_scale.numel() != 1 and tuple(x.branch_scale.shape) != (width,):
        raise ValueError(f"branch_scale must be a scalar or have shape ({width},), got {tuple(x.branch_scale.shape)}")
    if spec.family is Family.RMS and x.bias is not None:
        raise ValueError("RMSNorm has no bias")
    if spec.dropout_active and x.dropout_key is None:
        raise ValueError("dropout in training mode needs a dropout_key")
    if x.dropout_key is not None and (x.dropout_key.dim() != 0 or x.dropout_key.dtype != torch.int64):
        raise ValueError("dropout_key must be a 0-d int64 tensor")
