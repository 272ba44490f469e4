"""Hand-written fused add+RMSNorm modules, as Liger's and Transformer Engine's are called: ``forward(x,
residual)`` returns ``(normalized, x + residual)``; the others carry one bug each."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class FusedAddRMSNorm(nn.Module):
    """The sum, then RMSNorm of it with the mean square taken in ``accum`` (LLaMA's cast order)."""

    accum = torch.float32

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        total = x + residual
        h = total.to(self.accum)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype), total


class Float64AddRMSNorm(FusedAddRMSNorm):
    accum = torch.float64


class ResidualFirstAddRMSNorm(FusedAddRMSNorm):
    """Correct, but returns (residual, normalized)."""

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        normalized, total = super().forward(x, residual)
        return total, normalized


class Bf16StatisticsAddRMSNorm(FusedAddRMSNorm):
    """Takes the mean square in bfloat16, whatever the contract's accum says."""

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        total = x + residual
        mean_square = total.bfloat16().pow(2).mean(-1, keepdim=True).to(x.dtype)
        return self.weight * (total * torch.rsqrt(mean_square + self.eps)), total



class DetachedStatisticsAddRMSNorm(FusedAddRMSNorm):
    """The right forward, but the backward treats the row's RMS as a constant, as an approximate kernel might."""

    def forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        total = x + residual
        h = total.to(self.accum)
        scale = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps).detach()
        return self.weight * (h * scale).to(x.dtype), total
