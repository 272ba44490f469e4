"""Built-in branch modules by kind: self-/cross-attention (``attention.py``), plain and gated MLPs
(``mlp.py``), the mixture of experts (``moe.py``), embeddings and the vocabulary head (``embedding.py``).

Submodule names follow the HF LLaMA layout (``q_proj``/``k_proj``/``v_proj``/
``o_proj``, ``gate_proj``/``up_proj``/``down_proj``) so a real checkpoint's
branch weights load with a strict ``load_state_dict``. Every forward takes
the block's whole context as keyword arguments and ignores the keys it does
not use, so a compiled block can pass one context to all of its branches.
Each module states the context keywords it reads as ``blockir_context``,
beside its ``forward``: a compiled module accepts exactly the keywords that
something it calls reads (``blockir.lower.boundary``).
"""
from __future__ import annotations

from torch import nn

from blockir.lower.layers.attention import CrossAttention, SelfAttention
from blockir.lower.layers.attention_core import AttentionCore
from blockir.lower.layers.embedding import Embedding, Head
from blockir.lower.layers.mlp import MLP, GatedMLP
from blockir.lower.layers.moe import MoE

__all__ = ["AttentionCore", "BRANCH_KINDS", "CrossAttention", "Embedding", "GatedMLP", "Head", "MLP", "MoE",
           "SelfAttention"]

BRANCH_KINDS: dict[str, type[nn.Module]] = {
    "self_attention": SelfAttention,
    "cross_attention": CrossAttention,
    "mlp": MLP,
    "gated_mlp": GatedMLP,
    "moe": MoE,
}
