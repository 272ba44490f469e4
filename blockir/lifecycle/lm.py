"""A byte-level language model around a compiled block: embedding, the block, final norm, head.

Around an nGPT block (one that keeps its stream on a hypersphere) the embedding and head tables
are projected with the block's matrices, and the logits are scaled by nGPT's learned per-token
``s_z``, stored at ``1/sqrt(width)`` and applied times ``sqrt(width)`` (effective 1 at init).

The block's first input is the token stream ``[batch, seq, model]``; any further input (an
encoder–decoder layer's ``memory``) is the embedding of the bytes just before that window, so
the model predicts the next byte from text it has already seen. Attention is made causal by the
mask passed in the context (a non-causal built-in attention would otherwise read the bytes it is
asked to predict); externs' linear stand-ins are position-wise and see nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from blockir.analyses.sizes import Sizes
from blockir.analyses.summaries import summaries
from blockir.lower.boundary import reads
from blockir.diagnostics import BlockError, error
from blockir.ir.types import Role
from blockir.ir.program import Block, Program

VOCAB = 256  # bytes


@dataclass(frozen=True)
class Layout:
    """Where each input's bytes sit in one training window: inputs in order, then the next-byte target."""

    lengths: tuple[int, ...]  # sequence length of each block input
    width: int

    @property
    def window(self) -> int:
        return sum(self.lengths) + 1


def layout(program: Program, block: Block, sizes: Sizes) -> Layout:
    """Every input must be ``[batch, seq, model]`` of one width: the shape a token stream has."""
    lengths, widths = [], set()
    for p in block.params:
        roles = tuple(a.role for a in p.type.axes)
        if roles != (Role.BATCH, Role.SEQ, Role.MODEL):
            axes = ", ".join(a.name for a in p.type.axes)
            raise BlockError([error("E0724", f"a language-model run feeds '{block.name}' token embeddings, but its "
                                    f"input '{p.name}' is [{axes}], not [batch, seq, model]", p.span,
                                    hint="run a block or model whose inputs are [B, S, D] streams")])
        s = sizes.for_block(block)
        lengths.append(s.dim(p.type.axes[1].name))
        widths.add(s.dim(p.type.axes[2].name))
    if len(widths) != 1:
        raise BlockError([error("E0724", f"the inputs of '{block.name}' have different widths {sorted(widths)}; "
                                "one embedding cannot feed them", block.span)])
    return Layout(tuple(lengths), widths.pop())


def needs_final_norm(program: Program, block: Block) -> bool:
    """A head must read a normalized stream; add a norm only where the block does not end with one."""
    return not summaries(program)[block.name].ends_normalized


class ByteLM(nn.Module):
    def __init__(self, core: nn.Module, shape: Layout, final_norm: bool, sphere: bool = False) -> None:
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(VOCAB, shape.width)
        self.core = core
        self.norm = nn.LayerNorm(shape.width) if final_norm else nn.Identity()
        self.head = nn.Linear(shape.width, VOCAB, bias=False)
        self.logit_scale = nn.Parameter(torch.full((VOCAB,), shape.width ** -0.5)) if sphere else None

    def sphere_tables(self) -> tuple[tuple[torch.Tensor, int], ...]:
        """(weight, axis) of the tables nGPT projects besides the block's matrices: rows of the embedding and head."""
        return ((self.embed.weight, 1), (self.head.weight, 1)) if self.logit_scale is not None else ()

    def split(self, window: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(embedded block inputs, target bytes) of a ``[batch, window]`` byte tensor."""
        *memories, seq = self.shape.lengths
        start = sum(memories)
        inputs, at = [], 0
        for n in memories:
            inputs.append(self.embed(window[:, at:at + n]))
            at += n
        x = self.embed(window[:, start:start + seq])
        return [x, *inputs], window[:, start + 1:start + seq + 1]

    def context(self) -> dict[str, torch.Tensor]:
        if not reads(self.core, "attention_mask"):  # no attention: nothing to make causal
            return {}
        seq = self.shape.lengths[-1]
        return {"attention_mask": torch.ones(seq, seq, dtype=torch.bool, device=self.head.weight.device)
                .tril()[None, None]}

    def logits(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, target = self.split(window)
        logits = self.head(self.norm(self.core(*inputs, **self.context())))
        if self.logit_scale is not None:
            logits = logits * (self.logit_scale * self.shape.width ** 0.5)
        return logits, target

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        """Mean next-byte cross-entropy (nats) over the window."""
        logits, target = self.logits(window)
        return F.cross_entropy(logits.reshape(-1, VOCAB).float(), target.reshape(-1))
