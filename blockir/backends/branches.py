"""Built-in branch modules: self-/cross-attention, plain and gated MLPs.

Submodule names follow the HF LLaMA layout (``q_proj``/``k_proj``/``v_proj``/
``o_proj``, ``gate_proj``/``up_proj``/``down_proj``) so a real checkpoint's
branch weights load with a strict ``load_state_dict``. Every forward takes
the block's whole context as keyword arguments and ignores the keys it does
not use, so a compiled block can pass one context to all of its branches.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blockir.backends.numerics import ACTIVATIONS


def _activation(name: str) -> Callable[[Tensor], Tensor]:
    """Look up an activation by name, failing with the list of valid names."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None


def _split_heads(x: Tensor, head_dim: int) -> Tensor:
    """[B, S, H*hd] -> [B, H, S, hd]."""
    return x.view(*x.shape[:-1], -1, head_dim).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    """[B, H, S, hd] -> [B, S, H*hd]."""
    return x.transpose(1, 2).flatten(-2)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    """Share each key/value head across ``groups`` consecutive query heads (GQA)."""
    if groups == 1:
        return x
    return x.repeat_interleave(groups, dim=1)


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """RoPE tables for positions ``0..seq_len-1``, shaped ``[1, S, head_dim]`` like HF's.

    Frequencies and angles are computed in fp32 and only the tables are cast,
    which is what the HF rotary module does, so both routes agree exactly.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = positions[None, :, None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` [B, H, S, hd] by tables [B or 1, S, hd] in the rotate-half convention.

    Rotate-half pairs coordinate ``i`` with ``i + hd/2`` (not adjacent
    coordinates), which is the layout HF checkpoints' q/k weights assume.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """Scaled dot-product attention over heads; a given mask replaces the causal flag.

    The mask may be boolean (True = may attend) or additive; SDPA accepts
    both, matching the two formats HF builds for its attention back ends.
    """
    groups = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)


class _Projections(nn.Module):
    """The four attention projections and head bookkeeping shared by self- and cross-attention."""

    def __init__(
        self,
        width: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = False,
        out_bias: bool = False,
    ) -> None:
        super().__init__()
        kv_heads = kv_heads or heads
        if heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
        if head_dim is None:
            if width % heads:
                raise ValueError(f"width ({width}) is not divisible by heads ({heads}); pass head_dim")
            head_dim = width // heads
        # plain settings go straight to __dict__: nn.Module.__setattr__ costs ~1.5 µs each, which a
        # 1,000-layer compile pays thousands of times (benchmarks/compile_depth.py)
        vars(self).update(width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim)
        self.q_proj = nn.Linear(width, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=out_bias)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kv_heads={self.kv_heads}, head_dim={self.head_dim}"


class SelfAttention(_Projections):
    """Multi-head self-attention with optional GQA and RoPE, loadable from ``LlamaAttention`` weights."""

    def __init__(
        self,
        width: int,
        heads: int,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        causal: bool = True,
        rope: bool = False,
        rope_theta: float = 10000.0,
        bias: bool = False,
        out_bias: bool = False,
    ) -> None:
        super().__init__(width, heads, kv_heads, head_dim, bias, out_bias)
        vars(self).update(causal=causal, rope=rope, rope_theta=rope_theta)  # plain settings, as above

    def forward(
        self,
        x: Tensor,
        *,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        attention_mask: Tensor | None = None,
        **ctx: object,
    ) -> Tensor:
        """``x`` [B, S, D] -> [B, S, D].

        Caller-provided ``position_embeddings`` (cos, sin) win over the
        internal tables so that scaled RoPE variants computed by a host model
        are honoured.
        """
        q = _split_heads(self.q_proj(x), self.head_dim)
        k = _split_heads(self.k_proj(x), self.head_dim)
        v = _split_heads(self.v_proj(x), self.head_dim)
        if self.rope:
            if position_embeddings is None:
                seq_len = x.shape[1]
                position_embeddings = rope_cos_sin(seq_len, self.head_dim, self.rope_theta, x.device, x.dtype)
            cos, sin = position_embeddings
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(_merge_heads(_attend(q, k, v, attention_mask, self.causal)))

    def extra_repr(self) -> str:
        rope = f"rope={self.rope}, rope_theta={self.rope_theta}"
        return f"{super().extra_repr()}, causal={self.causal}, {rope}"


class CrossAttention(_Projections):
    """Attention from queries of ``x`` to keys/values of an encoder ``memory``; never causal."""

    def forward(self, x: Tensor, memory: Tensor, *, memory_mask: Tensor | None = None, **ctx: object) -> Tensor:
        """``x`` [B, T, D], ``memory`` [B, S, D] -> [B, T, D]; ``memory_mask`` broadcasts to [B, H, T, S]."""
        q = _split_heads(self.q_proj(x), self.head_dim)
        k = _split_heads(self.k_proj(memory), self.head_dim)
        v = _split_heads(self.v_proj(memory), self.head_dim)
        return self.o_proj(_merge_heads(_attend(q, k, v, memory_mask, causal=False)))


class MLP(nn.Module):
    """Two-layer feed-forward branch ``fc2(act(fc1(x)))``."""

    def __init__(self, width: int, hidden: int, act: str = "gelu", bias: bool = True) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=_activation(act))  # plain settings, as in _Projections
        self.fc1 = nn.Linear(width, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))

    def extra_repr(self) -> str:
        return f"act={self.act_name}"


class GatedMLP(nn.Module):
    """Gated feed-forward branch ``down(act(gate(x)) * up(x))`` (SwiGLU for ``act="silu"``)."""

    def __init__(self, width: int, hidden: int, act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=_activation(act))  # plain settings, as in _Projections
        self.gate_proj = nn.Linear(width, hidden, bias=bias)
        self.up_proj = nn.Linear(width, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

    def extra_repr(self) -> str:
        return f"act={self.act_name}"


BRANCH_KINDS: dict[str, type[nn.Module]] = {
    "self_attention": SelfAttention,
    "cross_attention": CrossAttention,
    "mlp": MLP,
    "gated_mlp": GatedMLP,
}

# torch.fx.symbolic_trace records these as single calls: their bodies read shapes as Python values.
torch.fx.wrap("_split_heads")
torch.fx.wrap("_attend")
