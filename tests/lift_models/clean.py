"""Hand-written blocks as people write them, each with the topology its name says."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

D, H, FF = 32, 4, 64


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, dim: int = D, heads: int = H) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, dim: int = D, hidden: int = FF) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class PreLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(D)
        self.attn = Attention()
        self.ln_2 = nn.LayerNorm(D)
        self.mlp = MLP()
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        x = x + self.drop(self.mlp(self.ln_2(x)))
        return x


class PostLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.norm1 = nn.LayerNorm(D)
        self.mlp = MLP()
        self.norm2 = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.mlp(x))


class RMSPreLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_norm = RMSNorm(D)
        self.attn = Attention()
        self.post_norm = RMSNorm(D)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.input_norm(x))
        return h + self.mlp(self.post_norm(h))


class Stack(nn.Module):
    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList([RMSPreLN() for _ in range(layers)])
        self.norm = RMSNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class ParallelShared(nn.Module):
    """GPT-J / Phi: one norm feeds both branches, both updates join the shortcut."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        return x + self.attn(h) + self.mlp(h)


class ParallelTwoNorms(nn.Module):
    """GPT-NeoX: each branch reads the layer input through its own norm."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(D)
        self.ln_mlp = nn.LayerNorm(D)
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln_attn(x)) + self.mlp(self.ln_mlp(x))


class Sandwich(nn.Module):
    """Gemma 2: every branch normalized on the way in and on the way out."""

    def __init__(self) -> None:
        super().__init__()
        self.pre_attn, self.post_attn = RMSNorm(D), RMSNorm(D)
        self.pre_mlp, self.post_mlp = RMSNorm(D), RMSNorm(D)
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.post_attn(self.attn(self.pre_attn(x)))
        return h + self.post_mlp(self.mlp(self.pre_mlp(h)))


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * x


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if p == 0.0 or not training:
        return x
    keep = 1 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class DropPath(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.p, self.training)


class CaiTBlock(nn.Module):
    """LayerScale and stochastic depth on each branch (timm's ViT Block with init_values)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(D, eps=1e-6)
        self.attn = Attention()
        self.ls1 = LayerScale(D)
        self.norm2 = nn.LayerNorm(D, eps=1e-6)
        self.mlp = MLP()
        self.ls2 = LayerScale(D)
        self.drop_path = DropPath(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


class ReZero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.mlp = MLP()
        self.resweight = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.resweight * self.attn(x)
        return h + self.resweight * self.mlp(h)


class DeepNorm(nn.Module):
    """DeepNet's Post-LN with the shortcut scaled by alpha = (2N)^(1/4)."""

    def __init__(self, layers: int = 6) -> None:
        super().__init__()
        self.alpha = (2 * layers) ** 0.25
        self.attn = Attention()
        self.ln_1 = nn.LayerNorm(D)
        self.mlp = MLP()
        self.ln_2 = nn.LayerNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x * self.alpha + self.attn(x))
        return self.ln_2(h * self.alpha + self.mlp(h))


class LlamaStyle(nn.Module):
    """A gated MLP written out by hand: the built-in gated_mlp."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(D)
        self.attn = Attention()
        self.mlp_norm = RMSNorm(D)
        self.mlp = GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.norm(x))
        return h + self.mlp(self.mlp_norm(h))


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, FF, bias=False)
        self.up_proj = nn.Linear(D, FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HandLayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return self.weight * ((x - mean) * torch.rsqrt(var + self.eps)) + self.bias


class HandLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = HandLayerNorm(D)
        self.attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.ln(x))


class Model(nn.Module):
    """Layers in a ModuleList and a final norm, with a learned layer scale and dropout."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([CaiTBlock() for _ in range(layers)])
        self.norm = nn.LayerNorm(D, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = block(x)
        return self.norm(x)
