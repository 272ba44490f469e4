"""Residual sites through a whole model: every update of the stream, by its full value path.

A site is one residual update as the structure analysis finds it: the value
the stream becomes (the sum), the shortcut operand it adds to, and the
branch operands that make the update ``u`` (several for a parallel block:
``x + attn(n) + mlp(n)`` is one site whose update is the sum of both).
Stacks and nested blocks are walked with an explicit work list, so depth is
bounded by memory, not by Python's recursion limit. Telemetry reads these
sites; so does every report that names a residual update. The same walk
finds the score states that score-carrying attentions (RealFormer) return.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

from blockir.analyses.sizes import Sizes
from blockir.analyses.structure import Sublayer, wrapper
from blockir.analyses.summaries import score_family
from blockir.ir.decls import InstanceDecl
from blockir.analyses.block_queries import applies_norm, has
from blockir.ir.traits import AddNorm, Calls, Scales
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.norms.dyt import FAMILY as DYT


class Site(NamedTuple):
    site: str  # the stream value after the add (the sum, before any post-norm), with its layer path
    shortcut: str  # the add operand carrying the shortcut
    updates: tuple[str, ...]  # the add operands carrying the branches; the update is their sum


class ScoreSite(NamedTuple):
    site: str  # the scores an attention returns (the running sum), with its layer path
    causal: bool  # whether the attention masks later keys: its probabilities see only the allowed ones


Scope = tuple[Block, Sizes, str]  # a called block, its sizes for that call, and its value-path prefix


def _ops(program: Program, block: Block, scope: Sizes, prefix: str) -> Iterator[tuple[Block, str, Op] | Scope]:
    """The block's ops with their prefix, and in place of each block instance the scopes of its calls."""
    for op in block.ops:
        d = block.decl_map.get(getattr(op, "decl", None) or "")
        if not isinstance(d, InstanceDecl):
            yield block, prefix, op
            continue
        inner = program.block(d.block)
        if d.count is None:
            yield inner, scope.for_block(inner), f"{prefix}{d.name}."
            continue
        n = scope.count(d.count, f"the layer count of '{d.name}'", d.span)
        for i in range(n):
            yield inner, scope.for_block(inner, i, n), f"{prefix}{d.name}.{i}."


def executed_ops(program: Program, block: Block, sizes: Sizes) -> Iterator[tuple[Block, str, Op]]:
    """Every op a call of ``block`` runs, in execution order, with the block that holds it and its value-path
    prefix (``layers.3.``): sub-blocks and stacks are entered where they are called."""
    stack = [_ops(program, block, sizes.for_block(block), "")]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item[1], Sizes):
            stack.append(_ops(program, *item))  # type: ignore[arg-type]
        else:
            yield item  # type: ignore[misc]


def _walk(program: Program, block: Block, sizes: Sizes) -> Iterator[Site | ScoreSite]:
    roots: dict[int, dict[int, Sublayer]] = {}  # per block: its sublayers by the op that closes them
    for inner, prefix, op in executed_ops(program, block, sizes):
        family = score_family(inner, op)
        if family is not None and has(op, Calls) and op.more:
            yield ScoreSite(prefix + op.more[0], family == "causal self-attention")
        if id(inner) not in roots:
            roots[id(inner)] = {id(sub.root): sub for sub in wrapper(inner).sublayers if sub.shortcut is not None}
        sub = roots[id(inner)].get(id(op))
        if sub is not None:
            total = sub.root.residual if has(sub.root, AddNorm) else sub.root.result
            yield Site(prefix + total, prefix + sub.shortcut, tuple(prefix + v for v in sub.updates))


def residual_sites(program: Program, block: Block, sizes: Sizes) -> list[Site]:
    """Every site reachable from ``block``, in execution order, through sub-blocks and stacks."""
    return [s for s in _walk(program, block, sizes) if isinstance(s, Site)]


def score_sites(program: Program, block: Block, sizes: Sizes) -> list[ScoreSite]:
    """Every score state an attention returns, reachable from ``block``, in execution order."""
    return [s for s in _walk(program, block, sizes) if isinstance(s, ScoreSite)]


class MethodSite(NamedTuple):
    kind: str  # gate (a learned scalar or vector on a branch: ReZero, LayerScale) | dyt
    param: str  # the gate's parameter path, or the DyT module path (its ``alpha`` is ``param + ".alpha"``)
    value: str | None  # dyt: the value path of the norm's input; gates: None


def method_sites(program: Program, block: Block, sizes: Sizes) -> list[MethodSite]:
    """Learned branch gates and DyT applications reachable from ``block``, in execution order."""
    out: list[MethodSite] = []
    seen: set[str] = set()
    for inner, prefix, op in executed_ops(program, block, sizes):
        decl = inner.decl_map.get(getattr(op, "decl", None) or getattr(op, "param", None) or "")
        if has(op, Scales) and op.param is not None and prefix + op.param not in seen \
                and any(op in b.scales for s in wrapper(inner).sublayers for b in s.branches):
            seen.add(prefix + op.param)
            out.append(MethodSite("gate", prefix + op.param, None))
        elif applies_norm(op) and getattr(decl, "kind", None) == DYT.name:
            out.append(MethodSite(DYT.name, prefix + op.decl, prefix + op.operand))
    return out
