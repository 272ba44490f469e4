"""A compiled model from token ids to logits (embedding and head inside it), trained on byte windows.

A model whose first input is ``[batch, seq]`` token ids and whose result is ``[batch, seq, vocab]``
logits — a written ``.block`` model with an ``embedding`` and a ``head``, or the causal LM of a
transformers folder — is its own language model: ``run`` feeds it the bytes of a window as token
ids and scores the next byte, so its vocabulary must hold every byte value. Positions are
``0 … S-1``; a model whose attention is not declared causal gets a causal mask, so it never reads
the byte it is asked to predict.
"""
from __future__ import annotations

import torch
from torch import nn

from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.types import Role
from blockir.lifecycle.lm import VOCAB, Layout
from blockir.lower.boundary import reads
from blockir.lower.distributed.loss import cross_entropy


def takes_tokens(block: Block) -> bool:
    """Whether ``block`` reads token ids ``[batch, seq]`` (an embedding inside it) rather than a stream."""
    return bool(block.params) and tuple(a.role for a in block.params[0].type.axes) == (Role.BATCH, Role.SEQ)


def _kinds(program: Program, kind: str) -> list[KindDecl]:
    return [d for b in program.blocks for d in b.decls if isinstance(d, KindDecl) and d.kind == kind]


def token_layout(program: Program, block: Block, sizes: Sizes) -> Layout:
    """One window: ``seq`` input tokens and the next byte; refused unless the model maps ids to byte logits."""
    roles = tuple(a.role for a in block.result.axes)
    if len(block.params) != 1 or roles[-1:] != (Role.VOCAB,):
        inputs = f"{len(block.params)} input{'s' if len(block.params) != 1 else ''}"
        result = ", ".join(a.name for a in block.result.axes)
        raise BlockError([error("E0843", f"a token-id run trains '{block.name}' on next-token logits, but it takes "
                                f"{inputs} and returns [{result}]",
                                block.span, hint="run a model with one input_ids: [B, S] and a head returning "
                                                 "[B, S, V] logits")])
    s = sizes.for_block(block)
    axis = block.result.axes[-1]
    vocab = s.dim(axis.name)
    if vocab < VOCAB:
        declared = next((d.span for d in program.dims if d.name == axis.name), block.span)
        raise BlockError([error("E0844", f"'{block.name}' has a vocabulary of {vocab} tokens, and a run feeds it "
                                f"bytes as token ids, which needs at least {VOCAB}", declared,
                                hint=f"give the model a vocabulary of {VOCAB} or more")])
    return Layout((s.dim(block.params[0].type.axes[1].name),), vocab)


class TokenLM(nn.Module):
    """``core`` (ids → logits) with the loss and the context ``run`` gives it; the interface of ByteLM."""

    logit_scale = None  # no nGPT output scale outside the model: the model owns its head

    def __init__(self, core: nn.Module, shape: Layout, causal: bool) -> None:
        super().__init__()
        self.shape, self.core, self.causal = shape, core, causal

    @staticmethod
    def is_causal(program: Program) -> bool:
        return all(d.arg("causal") for d in _kinds(program, "self_attention"))

    def sphere_tables(self) -> tuple[tuple[torch.Tensor, int], ...]:
        return ()

    def split(self, window: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        return [window[:, :-1]], window[:, 1:]

    def context(self) -> dict[str, torch.Tensor]:
        seq = self.shape.lengths[0]
        device = next(self.core.parameters()).device
        ctx = {"position_ids": torch.arange(seq, device=device)[None]}
        if not self.causal:
            ctx["attention_mask"] = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None, None]
        return {k: v for k, v in ctx.items() if reads(self.core, k)}

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) over the window, computed in fp32; logits a vocab-parallel head
        leaves split by vocabulary (``blockir.parallelize(..., vocab=True)``) go through ``loss_parallel``."""
        (ids,), target = self.split(window)
        return cross_entropy(self.core(ids, **self.context()), target)
