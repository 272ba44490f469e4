"""How a block's result relates to its first input: the identity route, as a caller sees it.

A residual update ``x + u`` carries its state forward unchanged (He et al.,
2016). Seen from a call, a block may

* return its first input changed only by casts, constant scales and dropout
  (a helper: on a caller's shortcut its dropout drops the identity path and
  its constant scales the shortcut);
* return its first input unchanged plus un-normalized updates (a residual
  update of its own: added to the caller's state as a branch, the caller's
  shortcut is counted twice);
* carry its first input forward through some update with a shortcut;
* or replace it by a computation that no update carries it past (a layer
  without a shortcut).

Each answer for a block reads only its own ops and the answers for the blocks
it calls (``summaries``), so the block summaries hold them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from blockir.analyses.calls import Declared, callee, identity, output_source
from blockir.analyses.sizes import value
from blockir.analyses.structure import Sublayer, decl_kind, wrapper
from blockir.diagnostics import Span
from blockir.analyses.block_queries import has, transparent
from blockir.ir.traits import Calls, Converts, Function, Scales, Stochastic
from blockir.ops import Op
from blockir.ir.program import Block, Program

if TYPE_CHECKING:
    from blockir.analyses.summaries import Summary

COMPUTATIONS = ("self_attention", "cross_attention", "mlp", "gated_mlp", "moe", "linear", "activation")


@dataclass(frozen=True)
class Passthrough:
    """A block that returns its first input changed only by casts, constant scales and dropout."""

    dropout: Span | None = None  # the first active dropout on the way
    scale: Span | None = None  # the first constant scale on the way
    factor: float | None = 1.0  # the product of the constant scales (None when one does not evaluate)


@dataclass(frozen=True)
class Route:
    """The ops from a stream value to an add operand that leave it the same value up to scale and dropout."""

    ops: tuple[Op, ...]  # program order
    dropout: Span | None  # the first active dropout on it, local or inside a helper
    helper: Op | None  # the first call of a helper block on it
    factor: float | None  # the product of its constant scales (None when one does not evaluate)
    scale: Span | None  # the first constant scale on it


def _times(a: float | None, b: float | int | None) -> float | None:
    return None if a is None or b is None else a * b


def route(program: Program, block: Block, leaf: str, state: str, env: Mapping[str, float | int],
          summaries: Mapping[str, Summary]) -> Route | None:
    """How ``leaf`` is ``state`` through casts, dropout, constant scales and calls of passthrough helpers, or
    None when something else lies between (a projection, a norm, a learned gate, a branch)."""
    ops: list[Op] = []
    dropout: Span | None = None
    scale: Span | None = None
    helper: Op | None = None
    factor: float | None = 1.0
    v = leaf
    while v != state:
        op = block.producers.get(v)
        d = callee(program, block, op)
        inner = summaries[d.block].passes_input if d is not None and d.count is None else None
        if has(op, Stochastic):
            dropout = op.span if value(op.p, env) != 0 else dropout
        elif has(op, Scales) and op.factor is not None:
            factor, scale = _times(factor, value(op.factor, env)), op.span
        elif inner is not None and has(op, Calls) and op.args:
            helper = op
            dropout, scale = inner.dropout or dropout, inner.scale or scale
            factor = _times(factor, inner.factor)
        elif not (has(op, Converts) or identity(block, op)):
            return None
        ops.append(op)  # type: ignore[arg-type]
        v = op.args[0] if has(op, Calls) else op.operands[0]  # type: ignore[union-attr]
    return Route(tuple(reversed(ops)), dropout, helper, factor, scale)


def passthrough(program: Program, block: Block, env: Mapping[str, float | int],
                summaries: Mapping[str, Summary]) -> Passthrough | None:
    """The block's result as its first input through casts, constant scales and dropout, if it is that."""
    if not block.params or block.output is None:
        return None
    r = route(program, block, block.output.value, block.params[0].name, env, summaries)
    return None if r is None else Passthrough(r.dropout, r.scale, r.factor)


def shortcut_route(program: Program, block: Block, s: Sublayer, env: Mapping[str, float | int],
                   summaries: Mapping[str, Summary]) -> tuple[str, Route] | None:
    """The add operand that carries the state of ``s`` and its route, looking through helper blocks where the
    residual wrapper found no shortcut of its own."""
    leaves = [s.shortcut] if s.shortcut is not None else list(s.leaves)
    for leaf in leaves:
        r = route(program, block, leaf, s.state, env, summaries) if leaf is not None else None
        if r is not None:
            return leaf, r  # type: ignore[return-value]
    return None


def identity_route(program: Program, block: Block, summaries: Mapping[str, Summary]) -> Span | None:
    """The first add of a block that returns its first input unchanged plus un-normalized updates."""
    w = wrapper(block)
    if not block.params or w.state_input != block.params[0].name or len(w.spine) < 2:
        return None
    subs = {s.result: s for s in w.sublayers}
    first: Span | None = None
    for v in w.spine[1:]:
        op = block.producers.get(v)
        s = subs.get(v)
        d = callee(program, block, op)
        if s is not None:
            if s.shortcut is None or s.post_norm is not None or s.fused_post or s.shortcut_ops:
                return None
            first = first or s.root.span
        elif d is not None and summaries[d.block].identity_route is not None:
            first = first or summaries[d.block].identity_route
        elif not has(op, Converts):
            return None
    return first


def replacing(block: Block, op: Op | None) -> bool:
    """A computation on the stream that keeps its type and carries nothing of its input past it."""
    if has(op, Function):
        return op.fn != "identity" and block.type_of(op.result).names == block.type_of(op.operand).names
    if not has(op, Calls) or decl_kind(block, op) not in COMPUTATIONS or identity(block, op) \
            or not op.args:
        return False
    return block.type_of(op.result).names == block.type_of(op.args[0]).names


def carries(program: Program, block: Block, env: Mapping[str, float | int],
            summaries: Mapping[str, Summary]) -> bool:
    """Whether some update carries the block's stream forward: a shortcut of its own, or through a call."""
    w = wrapper(block)
    if any(shortcut_route(program, block, s, env, summaries) is not None or s.shortcut is not None
           for s in w.sublayers):
        return True
    return any((d := callee(program, block, block.producers.get(v))) is not None and summaries[d.block].carries
               for v in w.spine[1:])


def replaces_state(program: Program, block: Block, summaries: Mapping[str, Summary], carried: bool) -> Declared | None:
    """The op computing a block's result from its stream with no update carrying the stream past it, in a block
    where no update carries it at all (``carried``: a block with updates reports such an op itself)."""
    if carried:
        return None
    for v in wrapper(block).spine[1:]:
        op = block.producers.get(v)
        if replacing(block, op):
            return Declared(getattr(op, "decl", None) or getattr(op, "fn", ""), op.span)  # type: ignore[union-attr]
        d = callee(program, block, op)
        inner = summaries[d.block].replaces_state if d is not None else None
        if inner is not None:
            return Declared(f"{d.name}.{inner.path}", inner.span)  # type: ignore[union-attr]
    return None


def head_call(block: Block, op: Op | None) -> bool:
    """A call of a declared output head."""
    return has(op, Calls) and decl_kind(block, op) == "head"


def head_source(program: Program, block: Block, summaries: Mapping[str, Summary]
                ) -> tuple[Op, str, Op | None] | None:
    """(the head, the value it reads, that value's producer seen through transparent ops) when the block's
    result is a head applied to something, here or inside a block it calls on the way out."""
    _, op = output_source(block)
    d = callee(program, block, op)
    if not head_call(block, op) and not (d is not None and summaries[d.block].raw_head is not None):
        return None
    v = op.args[0] if has(op, Calls) and op.args else None  # type: ignore[union-attr]
    src = block.producers.get(v) if v is not None else None
    while transparent(src) or identity(block, src):
        v = src.operands[0]  # type: ignore[union-attr]
        src = block.producers.get(v)
    return op, v, src  # type: ignore[return-value]


def raw_head(program: Program, block: Block, summaries: Mapping[str, Summary]) -> Declared | None:
    """The head a block applies to its first input with no norm between."""
    found = head_source(program, block, summaries)
    if found is None or not block.params or found[1] != block.params[0].name:
        return None
    op = found[0]
    d = callee(program, block, op)
    if d is not None:
        inner = summaries[d.block].raw_head
        return Declared(f"{d.name}.{inner.path}", inner.span)  # type: ignore[union-attr]
    return Declared(op.decl, op.span)  # type: ignore[union-attr]
