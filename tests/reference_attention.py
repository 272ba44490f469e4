"""Causal multi-head attention written from its equation, for float64 oracles of whole layers."""
from __future__ import annotations

import torch
from torch import Tensor


def causal_attention(x: Tensor, p: dict[str, Tensor], prefix: str, heads: int) -> Tensor:
    """``o_proj(concat_i(gamma_i softmax(q_i k_i^T / sqrt(d)) v_i))``; gamma is ``{prefix}.head_scale`` if present."""
    b, s, d = x.shape
    hd = d // heads

    def split(t: Tensor) -> Tensor:
        return t.view(b, s, heads, hd).transpose(1, 2)
    q, k, v = (split(x @ p[f"{prefix}.{n}_proj.weight"].T) for n in "qkv")
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ v).transpose(1, 2)  # [B, S, H, hd]
    if f"{prefix}.head_scale" in p:
        o = o * p[f"{prefix}.head_scale"][:, None]
    return o.reshape(b, s, d) @ p[f"{prefix}.o_proj.weight"].T
