"""The mixture-of-experts branch: a router, experts stored as two 3-D tensors, and an optional shared expert.

The computation follows transformers' sparse MoE blocks (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) step for
step, so a checkpoint's logits are reproduced bit for bit: the experts run in index order, each on the rows
routed to it, and each product is scaled by its routing weight and added into a zero tensor with
``index_add_``, which fixes the order of the additions.
"""
from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from blockir.lower.boundary import NOTHING
from blockir.lower.layers.mlp import GatedMLP, activation


class Experts(nn.Module):
    """``experts`` gated MLPs ``down(act(gate(x)) * up(x))``, stacked: ``gate_up_proj`` [E, 2H, D] (the gate rows
    first) and ``down_proj`` [E, D, H], as transformers 5 stores them."""

    def __init__(self, experts: int, width: int, hidden: int, act: str) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=activation(act), count=experts)
        self.gate_up_proj = nn.Parameter(torch.empty(experts, 2 * hidden, width))
        self.down_proj = nn.Parameter(torch.empty(experts, width, hidden))
        for weight in (self.gate_up_proj, self.down_proj):  # each expert's matrix as nn.Linear draws it
            bound = 1.0 / math.sqrt(weight.shape[-1])
            nn.init.uniform_(weight, -bound, bound)

    def matrices(self) -> tuple[Tensor, Tensor]:
        """The gate/up and down matrices the forward multiplies by; tensor parallelism replaces them with this
        rank's rows (``blockir.lower.distributed.experts``)."""
        return self.gate_up_proj, self.down_proj

    def forward(self, x: Tensor, index: Tensor, weights: Tensor) -> Tensor:
        out = torch.zeros_like(x)
        gate_up_proj, down_proj = self.matrices()
        with torch.no_grad():
            mask = nn.functional.one_hot(index, num_classes=self.count).permute(2, 1, 0)  # [E, k, rows]
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit:
            e = e[0]
            slot, rows = torch.where(mask[e])
            gate, up = nn.functional.linear(x[rows], gate_up_proj[e]).chunk(2, dim=-1)
            y = nn.functional.linear(self.act(gate) * up, down_proj[e])
            y = y * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out

    def extra_repr(self) -> str:
        return f"experts={self.count}, act={self.act_name}"


class MoE(nn.Module):
    """Each token's weighted sum of its ``top_k`` experts, plus a (gated) shared expert when given."""

    def __init__(self, width: int, hidden: int, experts: int, top_k: int, act: str = "silu",
                 routing: str = "softmax_topk", norm_topk: bool = False, weights: str = "f32",
                 shared: int | None = None, shared_gate: bool = False, *, router: str = "gate",
                 experts_name: str = "experts", shared_expert: str = "shared_expert",
                 shared_expert_gate: str = "shared_expert_gate") -> None:
        super().__init__()
        vars(self).update(top_k=top_k, routing=routing, norm_topk=norm_topk, weights=weights,
                          names={"router": router, "experts": experts_name, "shared": shared_expert,
                                 "shared_gate": shared_expert_gate}, has_shared=shared is not None,
                          has_gate=shared_gate)
        self.add_module(router, nn.Linear(width, experts, bias=False))
        self.add_module(experts_name, Experts(experts, width, hidden, act))
        if shared is not None:
            self.add_module(shared_expert, GatedMLP(width, shared, act))
            if shared_gate:
                self.add_module(shared_expert_gate, nn.Linear(width, 1, bias=False))

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The experts of each row and their weights, ``[rows, top_k]`` each."""
        logits = getattr(self, self.names["router"])(x)
        if self.routing == "softmax_topk":
            weights, index = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float), self.top_k, dim=-1)
        else:
            top, index = torch.topk(logits, self.top_k, dim=-1)
            weights = torch.softmax(top, dim=-1, dtype=torch.float)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (weights.to(logits.dtype) if self.weights == "input" else weights), index

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        shared = getattr(self, self.names["shared"])(rows) if self.has_shared else None
        weights, index = self.route(rows)
        out = getattr(self, self.names["experts"])(rows, index, weights)
        if shared is not None:
            if self.has_gate:
                shared = torch.sigmoid(getattr(self, self.names["shared_gate"])(rows)) * shared
            out = out + shared
        return out.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, routing={self.routing}, norm_topk={self.norm_topk}, weights={self.weights}"
