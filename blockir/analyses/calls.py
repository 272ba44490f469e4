"""Calls and returns: which block a call instantiates, and what a block returns.

Every call-aware analysis asks these first; they sit below the block summaries
and the analyses the summaries are built from.
"""
from __future__ import annotations

from dataclasses import dataclass

from blockir.diagnostics import Span
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.analyses.block_queries import has, transparent
from blockir.ir.traits import Calls, Function
from blockir.ops import Op
from blockir.ir.program import Block, Program


@dataclass(frozen=True)
class Declared:
    """A declaration found in a block or below it, named by its path from the summarised block."""

    path: str
    span: Span


def callee(program: Program, block: Block, op: Op | None) -> InstanceDecl | None:
    """The sub-block or stack declaration ``op`` calls, if it calls one that exists."""
    d = block.decl_map.get(getattr(op, "decl", None) or "")
    return d if has(op, Calls) and isinstance(d, InstanceDecl) and d.block in program.block_map else None


def identity(block: Block, op: Op | None) -> bool:
    """The identity activation, written as an op or as a declared activation."""
    if has(op, Function):
        return op.fn == "identity"
    d = block.decl_map.get(getattr(op, "decl", None) or "")
    return has(op, Calls) and isinstance(d, KindDecl) and d.kind == "activation" and d.arg("fn") == "identity"


def _transparent(block: Block, op: Op | None) -> bool:
    """Ops that leave a normalized value normalized: casts, dropout, scales and the identity activation."""
    return transparent(op) or identity(block, op)


def output_source(block: Block) -> tuple[str | None, Op | None]:
    """The value the block returns and its producer, looking through transparent ops."""
    v = block.output.value if block.output is not None else None
    op = block.producers.get(v) if v is not None else None
    while _transparent(block, op):
        v = op.operands[0]  # type: ignore[union-attr]
        op = block.producers.get(v)
    return v, op
