"""A branch's projection matrices, stored as ``nn.Linear`` or as GPT-2's transposed ``Conv1D``."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class Conv1D(nn.Module):
    """GPT-2's transposed linear: ``weight`` stored ``[in, out]``, computed with one ``addmm`` as HF does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        y = torch.addmm(self.bias, flat, self.weight) if self.bias is not None else flat @ self.weight
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def dense(in_features: int, out_features: int, bias: bool, conv1d: bool) -> nn.Module:
    """A projection stored as ``nn.Linear`` (``[out, in]``) or as GPT-2's ``Conv1D`` (``[in, out]``)."""
    return Conv1D(in_features, out_features, bias) if conv1d else nn.Linear(in_features, out_features, bias=bias)
