"""The residual wrapper of a block: which value is the state, where it is updated, by what.

Every verifier that reasons about topology (placement, dropout position,
shortcut scaling, in-place writes, folding) needs the same decomposition of a
block into *sublayers*: one residual add (possibly a tree of adds joining
several branches) plus the norms around it. This module computes it once from
the op graph:

* the **state input** is the input whose axes equal the block's result axes;
* the **spine** is the chain of ops every path from the state input to the
  output passes through (immediate dominators); the stream values live there;
* each add on the spine is a sublayer root; its operand leaves split into the
  **shortcut** (the leaf reached from the previous stream value through
  scales, dropouts, casts and gate products, else a projection, else a norm)
  and the **branches**;
* a **gate** is a product ``z * v`` whose factor ``z`` is a sigmoid, tanh or
  erf of something, or ``1 - z`` of one: a gated residual
  ``z * x + (1 - z) * u`` is one update whose shortcut and branch are gated;
* a norm whose only input is the sum is the sublayer's post-norm (Post-LN);
* an update ``alpha * (t - x)`` that steps from the state toward a target is an
  **interpolation** (nGPT's ``unit(x + alpha * (unit(f(x)) - x))``): the branch
  computes ``t``, and the state it subtracts is not a second shortcut.

The pieces live in their own modules: ``sublayers`` (what is found), ``decompose`` (how),
``block_queries`` (questions about one op or value); this module caches the result per block and
answers the questions asked of a sublayer. Every name is importable from here.
"""
from __future__ import annotations

from blockir.analyses.block_queries import (GATE_FUNCTIONS, ancestors, applies_norm, decl_kind, describe,
                                            embedded, gated, has, is_gate, is_linear, state_input, stream_norm)
from blockir.analyses.cache import per_object
from blockir.analyses.decompose import branch_kind, decompose, op_graph, spine
from blockir.analyses.sublayers import Branch, Sublayer, Wrapper
from blockir.ir.program import Block
from blockir.ir.traits import AddNorm, Difference, Scales
from blockir.ops import Op
from blockir.norms import FAMILIES

__all__ = ["GATE_FUNCTIONS", "Branch", "Sublayer", "Wrapper", "ancestors", "attention_norms", "branch_kind",
           "decl_kind", "describe", "embedded", "gated", "interpolation", "is_gate", "is_linear",
           "normalized_shortcut", "op_graph", "retracted", "spine", "state_input", "stream_norm", "wrapper"]


@per_object
def wrapper(block: Block) -> Wrapper:
    """Decompose ``block`` into its residual sublayers (see the module docstring); cached per block object."""
    return decompose(block)


def normalized_shortcut(block: Block, sub: Sublayer) -> Op | None:
    """The norm whose output this update uses as its shortcut, when the stream continues from a normalized value.

    Either the shortcut path passes through a norm, or the update starts from
    a norm's output without normalizing its own sum (so it is not Post-LN).
    """
    norm = next((op for op in sub.shortcut_ops if stream_norm(block, op)), None)
    if norm is not None:
        return norm
    start = block.producers.get(sub.state)
    # a fused add+norm whose residual nothing reads hands the stream on normalized, as a Post-LN norm does
    from_norm = applies_norm(start) or has(start, AddNorm) and sub.state == start.normalized  # type: ignore[union-attr]
    if from_norm and stream_norm(block, start) and sub.post_norm is None \
            and not sub.root.has(AddNorm):
        return start
    return None


def interpolation(block: Block, sub: Sublayer) -> Op | None:
    """The difference ``t - state`` an update steps along, when its one update is scales of it (nGPT)."""
    if len(sub.updates) != 1:
        return None
    op = block.producers.get(sub.updates[0])
    while has(op, Scales):
        op = block.producers.get(op.operand)  # type: ignore[union-attr]
    return op if has(op, Difference) and op.rhs == sub.state else None  # type: ignore[union-attr]


def retracted(block: Block, sub: Sublayer) -> bool:
    """Whether an update is nGPT's: an interpolation whose sum an ``l2norm`` brings back to unit length."""
    post = sub.post_norm
    return interpolation(block, sub) is not None and post is not None and \
        (kind := decl_kind(block, post)) in FAMILIES and FAMILIES[kind].unit_length


def attention_norms(block: Block) -> tuple[Op, ...]:
    """The norm applications whose output an attention branch reads (DyT's attention sites)."""
    return tuple(n for s in wrapper(block).sublayers for b in s.branches
                 if b.call is not None and decl_kind(block, b.call) in ("self_attention", "cross_attention")
                 for n in b.pre_norms if applies_norm(n))
