"""In-place glue of inference: which residual adds write over a buffer, and which calls donate one.

The inference buffer plan (``analyses/liveness``) decides which adds may overwrite an operand;
this only keeps that from reaching a buffer the block does not own (the caller's inputs, unless
donated, and whatever aliases them).
"""
from __future__ import annotations

from blockir.ir.op import OpBase
from blockir.ir.program import Block
from blockir.ir.traits import Modifier, Scales


def _aliases(op: OpBase | None) -> bool:
    """Whether ``op``'s result may be its operand's own tensor: a modifier that does not scale changes only
    the dtype (``.to`` of the dtype a tensor has returns it) or draws a mask (the identity in inference)."""
    return op is not None and op.has(Modifier) and not op.has(Scales)


def _origin(block: Block, value: str) -> str:
    """Follow values that may be their operand's own tensor (dropout, cast) back to their source."""
    op = block.producers.get(value)
    while _aliases(op):
        value = op.operand  # type: ignore[union-attr]
        op = block.producers.get(value)
    return value


def _owned(block: Block, value: str, donated: bool) -> bool:
    """May this block overwrite ``value``? Its inputs only when the caller donated them."""
    return donated or _origin(block, value) not in {op.result for op in block.inputs}


def inplace_adds(block: Block, donated: bool) -> dict[int, str]:
    """id(op) → the operand whose buffer it overwrites, for the ops the plan writes in place; an op's
    lowering hook asks for its own entry (see ``GraphBuilder.inplace_target``)."""
    from blockir.analyses.liveness import plan  # the inference buffer plan decides; this only applies it
    return {id(d.op): d.target for d in plan(block, "infer").adds
            if d.inplace and _owned(block, d.target, donated)}


def donates_to(block: Block, decl: str, donated: bool) -> bool:
    """Whether the value passed to sub-block/stack ``decl`` is dead afterwards and owned here."""
    calls = [(i, op) for i, op in enumerate(block.ops) if getattr(op, "decl", None) == decl]
    if len(calls) != 1:
        return False
    index, call = calls[0]
    arg = call.operands[0]
    later = any(arg in op.operands for op in block.ops[index + 1:])
    return not later and _owned(block, arg, donated)
