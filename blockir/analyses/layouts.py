"""Layouts: where every value lives over the device mesh.

A file states placements only at block boundaries (parameters, results,
extern signatures); this analysis carries them through each block. Norms,
scales, casts, activations and dropout keep their operand's placement
(norms and elementwise ops act row by row or element by element); a sum
``a + b`` or difference ``a - b`` keeps its left operand's. A
built-in branch or linear returns the placement of its input: its derived
plan splits the inner projections and reduces (or reduce-scatters) the
outer one back to the stream's layout before the result leaves it. An
extern returns what its signature declares, else its input's placement. A
call to another block analyses that block under the caller's placements
for every parameter the callee leaves undeclared, so a layer without
annotations inherits the layout of the model that stacks it.

How each op kind places its results is that kind's ``LAYOUT`` hook (``blockir/ops/<kind>.py``):
``(op, ctx, analyser)`` records the placements of ``op``'s results in ``ctx`` through the
methods of :class:`BlockLayouts` and :meth:`_Analyser.call`.

A mesh axis a layout does not mention is replicated over, so ``()`` and
``tp=replicate`` compare equal. Files without a ``mesh`` dim have no layouts
and the analysis is empty.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from blockir.analyses.cache import per_object
from blockir.diagnostics import Span
from blockir.ir.decls import ExternDecl, InstanceDecl, Param
from blockir.ir.hooks import LAYOUT
from blockir.ir.traits import Normalizes
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.ir.types import Layout, Placement, Role

Canon = frozenset[tuple[str, str, "str | None"]]


def canon(layout: Layout) -> Canon:
    """The placements that differ from replication: what two layouts must agree on."""
    return frozenset((p.mesh, p.kind, p.axis) for p in layout if p.kind != "replicate")


def same(a: Layout, b: Layout) -> bool:
    return canon(a) == canon(b)


def placement(layout: Layout, mesh: str) -> Placement:
    return next((p for p in layout if p.mesh == mesh), Placement(mesh, "replicate"))


def partial(layout: Layout) -> tuple[str, ...]:
    """Mesh axes over which the value is a pending sum."""
    return tuple(p.mesh for p in layout if p.kind == "partial")


def sharded(layout: Layout, axis: str) -> tuple[str, ...]:
    """Mesh axes that split tensor axis ``axis``."""
    return tuple(p.mesh for p in layout if p.kind == "shard" and p.axis == axis)


def describe_layout(layout: Layout) -> str:
    shown = [p for p in layout if p.kind != "replicate"]
    return ", ".join(map(str, shown)) if shown else "replicated"


def meshes(program: Program) -> tuple[str, ...]:
    return tuple(d.name for d in program.dims if d.role is Role.MESH)


@dataclass(frozen=True)
class Boundary:
    """A value meeting a declared layout: a call argument, or the value a block returns."""

    op: Op
    value: str
    found: Layout
    declared: Layout
    target: str  # how a diagnostic names the declaration, e.g. "parameter 'x' of extern 'f'"
    declared_at: Span


@dataclass
class BlockLayouts:
    """One block analysed under one assignment of placements to its inputs."""

    block: Block
    inputs: tuple[Layout, ...]
    values: dict[str, Layout] = field(default_factory=dict)
    boundaries: list[Boundary] = field(default_factory=list)
    callees: dict[int, "BlockLayouts"] = field(default_factory=dict)  # id(call op) → callee analysis

    def of(self, value: str) -> Layout:
        return self.values.get(value, ())

    def bind(self, param: str) -> None:
        """A block parameter takes the placement this analysis was given for it."""
        self.values[param] = dict(zip((p.name for p in self.block.params), self.inputs)).get(param, ())

    def keep(self, op: Op, value: str) -> None:
        """Every result of ``op`` keeps the placement of ``value`` (an op acting row by row or element by element)."""
        for r in op.results:
            self.values[r] = self.of(value)

    def returns(self, op: Op, value: str) -> None:
        """The block returns ``value``: it meets the block's declared result placement, if any."""
        if self.block.result_layout:
            self.boundaries.append(Boundary(op, value, self.of(value), self.block.result_layout,
                                            f"the declared result of {self.block.kind} '{self.block.name}'",
                                            self.block.span))

    def contexts(self) -> list["BlockLayouts"]:
        """This analysis and every callee analysis below it, each once."""
        out: list[BlockLayouts] = []
        seen: set[int] = set()
        stack = [self]
        while stack:
            ctx = stack.pop()
            if id(ctx) in seen:
                continue
            seen.add(id(ctx))
            out.append(ctx)
            stack.extend(ctx.callees.values())
        return out


class _Analyser:
    def __init__(self, program: Program):
        self.program = program
        self.memo: dict[tuple[str, tuple[Canon, ...]], BlockLayouts] = {}

    def run(self, block: Block, given: tuple[Layout, ...]) -> BlockLayouts:
        inputs = tuple(p.layout if p.layout else g for p, g in zip(block.params, given))
        key = (block.name, tuple(canon(i) for i in inputs))
        if key in self.memo:
            return self.memo[key]
        out = BlockLayouts(block, inputs)
        self.memo[key] = out
        for op in block.ops:
            LAYOUT.of(op)(op, out, self)
        return out

    def _check_args(self, ctx: BlockLayouts, op: Op, params: tuple[Param, ...], what: str) -> None:
        for p, arg in zip(params, op.args):
            if p.layout:
                ctx.boundaries.append(Boundary(op, arg, ctx.of(arg), p.layout,
                                               f"parameter '{p.name}' of {what}", p.span))

    def call(self, ctx: BlockLayouts, op: Op) -> Layout:
        """The placement of what a call of a declaration returns (``op.decl`` applied to ``op.args``)."""
        d = ctx.block.decl_map.get(op.decl)
        first = ctx.of(op.args[0]) if op.args else ()
        if isinstance(d, ExternDecl):
            self._check_args(ctx, op, d.params, f"extern '{d.name}'")
            return d.result_layout or first
        if isinstance(d, InstanceDecl) and d.block in self.program.block_map:
            callee = self.program.block(d.block)
            self._check_args(ctx, op, callee.params, f"block '{callee.name}'")
            sub = self.run(callee, tuple(ctx.of(a) for a in op.args))
            ctx.callees[id(op)] = sub
            returned = callee.output.value if callee.output is not None else None
            return callee.result_layout or (sub.of(returned) if returned else first)
        return first


@per_object
def _analyser(program: Program) -> _Analyser:
    return _Analyser(program)


def layouts(program: Program, block: Block, given: tuple[Layout, ...] | None = None) -> BlockLayouts:
    """``block`` analysed with its declared input placements, or ``given`` where it declares none."""
    return _analyser(program).run(block, given if given is not None else tuple(() for _ in block.params))


def all_contexts(program: Program) -> list[BlockLayouts]:
    """Every block under its own declarations and every context a call reaches; empty without a mesh."""
    if not meshes(program):
        return []
    seen: dict[int, BlockLayouts] = {}
    for b in program.blocks:
        for ctx in layouts(program, b).contexts():
            seen.setdefault(id(ctx), ctx)
    return list(seen.values())


def norm_sites(ctx: BlockLayouts) -> list[tuple[Op, str, Layout]]:
    """(op, norm declaration, placement of the normalized row) for every norm in the block."""
    out: list[tuple[Op, str, Layout]] = []
    for op in ctx.block.ops:
        if op.has(Normalizes):  # a norm's result keeps the placement of the row it normalizes
            out.append((op, op.decl, ctx.of(op.result)))
    return out
