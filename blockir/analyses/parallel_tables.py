"""The tensor-parallel plan of the tables at the stream's two ends: a token embedding and a head.

By default each computes on full tensors, its table replicated. An embedding looks up every rank's full ids
and its rows are then cut to the stream's layout, which sends nothing; their gradient is gathered back at
the model's boundary, outside the embedding's own backward. A head reads the stream's rows gathered whole.

With ``vocab=True`` a table of one row per vocabulary entry (``by_vocab``) is split by rows, as Megatron-LM
splits them. The embedding's output is a pending sum (a rank contributes the rows of the ids it holds),
reduced onto the stream's layout. The head reads full rows and leaves its logits split by vocabulary for a
cross-entropy under ``loss_parallel``: its input gradient is a pending sum, and the loss all-reduces the row
maximum, the row sum of exponentials and the target's logit (B·S values each).
"""
from __future__ import annotations

from typing import Any

from blockir.analyses.collectives import GATHER, Collective
from blockir.analyses.sizes import Sizes
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block


def by_vocab(d: KindDecl, block: Block) -> bool:
    """Whether ``d`` has one row per vocabulary entry: a head, or an embedding of the token ids (the block's
    first input) — not of positions, nor of another id input (BERT's token types, a table of a few rows that
    Megatron-LM keeps replicated)."""
    if d.kind == "head":
        return True
    if d.kind != "embedding" or d.arg("positions") or not block.params:
        return False
    ids = block.params[0].name
    return any(op.applied == (d.name,) and op.operands[:1] == (ids,) for op in block.ops)


def plan_embedding(planner: Any, d: KindDecl, path: str, layer: str, sizes: Sizes, block: Block) -> bool:
    """Place an embedding (``planner`` is the plan's ``_Planner``) and count its collectives."""
    elements = _elements(planner, d, block, sizes, reads=False)
    if planner.plan.vocab and by_vocab(d, block):
        _split(planner, d, path, sizes, "vocab_embedding")
        planner._param(f"{path}.weight", "shard(0)")
        planner._reduced(layer, path, elements)
        return True
    planner.styled(path, "embedding", d.kind)
    planner._param(f"{path}.weight", "replicate")
    if GATHER[planner.layout]:
        planner._backward(layer, Collective("", "all-gather", elements))
    return True


def plan_head(planner: Any, d: KindDecl, path: str, layer: str, sizes: Sizes, block: Block) -> bool:
    """Place a head and count its collectives."""
    elements = _elements(planner, d, block, sizes, reads=True)
    split = planner.plan.vocab
    if split:
        _split(planner, d, path, sizes, "vocab_head")
        rows = planner.elements // sizes.dim(planner.stream_axis)
        planner.plan.loss = [Collective("loss", "all-reduce", rows) for _ in range(3)]
    else:
        planner.styled(path, "head", d.kind)
    for key in ("weight", "bias") if d.arg("bias") else ("weight",):
        planner._param(f"{path}.{key}", "shard(0)" if split else "replicate")
    planner._gathered(layer, path, partial=split, elements=elements)
    return True


def _split(planner: Any, d: KindDecl, path: str, sizes: Sizes, style: str) -> None:
    """The table split by vocabulary rows under ``style``, which the degree must divide."""
    rows, world = sizes.dim(d.arg("vocab")), planner.world
    if rows % world:
        raise BlockError([error(
            "E0608", f"{d.kind} '{d.name}' has a vocabulary of {rows} rows, which {world} ranks cannot "
            f"split evenly", d.span,
            hint=f"pad the vocabulary to a multiple of {world} (Megatron-LM pads to a multiple of 128 times "
                 "the degree), or keep the embedding and head replicated (no vocab-parallelism)")])
    planner.styled(path, style, d.kind)


def _elements(planner: Any, d: KindDecl, block: Block, sizes: Sizes, reads: bool) -> int:
    """The size of the features a head reads (``reads``) or an embedding writes: the stream's rows times the
    width of that tensor, which a projection may make narrower than the stream."""
    op = next((op for op in block.ops if op.applied == (d.name,)), None)
    t = None if op is None else (block.type_of(op.operands[0]) if reads else op.type_of(op.result))
    if t is None:
        return planner.elements
    return planner.elements // sizes.dim(planner.stream_axis) * sizes.dim(t.names[-1])
