"""Hand-written blocks with the residual-stream bugs real code ships with.

Each class marks the line of its mistake with a trailing ``# expect: CODE`` comment; the lift must
report that code at that line.
"""
from __future__ import annotations

import torch
from torch import nn

from lift_models.clean import D, MLP, Attention, RMSNorm


class DropoutAfterAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = Attention()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x + self.attn(self.ln(x)))  # expect: E0402


class DroppedShortcut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = Attention()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x) + self.attn(self.ln(x))  # expect: E0401


class SeqRMSNorm(nn.Module):
    """An RMSNorm whose mean runs over the sequence: each token's scale depends on the others."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)  # expect: E0301
        return self.weight * x


class NormOverSeq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = SeqRMSNorm(D)
        self.attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class SharedNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln(x))
        return h + self.mlp(self.ln(h))  # expect: E0307


class NormalizedResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x))
        h = self.ln_2(h)
        return h + self.mlp(h)  # expect: E0412


class PreLNLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = RMSNorm(D)
        self.attn = Attention()
        self.ln_2 = RMSNorm(D)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class NoFinalNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([PreLNLayer() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x  # expect: E0403


class DoubledFinalNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([PreLNLayer() for _ in range(2)])
        self.norm = RMSNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return self.norm(x)  # expect: E0307


class OffsetTwice(nn.Module):
    """A Gemma-style ``1 + w`` gain over weights a conversion already stored around one."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return (n * (1.0 + self.weight.float())).type_as(x)  # expect: E0909


class OffsetTwiceLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = OffsetTwice()
        self.attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class ProjectedShortcut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = Attention()
        self.skip = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip(x) + self.attn(self.ln(x))  # expect: E0409
