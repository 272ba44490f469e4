"""Programs: dims, constants and blocks. Immutable; lookups are derived, not stored."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from blockir.diagnostics import Span, UNKNOWN_SPAN
from blockir.ir.consts import ConstExpr
from blockir.ir.decls import Decl, Param
from blockir.ir.traits import BlockInput, Sink
from blockir.ir.op import OpBase as Op
from blockir.ir.types import Axis, Layout, TensorType


@dataclass(frozen=True)
class Const:
    """A named constant expression."""

    name: str
    value: ConstExpr
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)


@dataclass(frozen=True)
class Block:
    """A typed block: parameters, declarations and its ops in SSA order."""

    name: str
    kind: str  # "block" | "model"
    params: tuple[Param, ...]
    result: TensorType
    consts: tuple[Const, ...]
    decls: tuple[Decl, ...]
    ops: tuple[Op, ...]
    span: Span = field(default=UNKNOWN_SPAN, compare=False, repr=False)
    result_layout: Layout = ()  # declared placement of the result over mesh axes
    # the carried streams after the hidden state: result i + 1 feeds input i + 1 of the next layer of a stack
    more_results: tuple[TensorType, ...] = ()

    @property
    def results(self) -> tuple[TensorType, ...]:
        return (self.result, *self.more_results)

    @cached_property
    def decl_map(self) -> dict[str, Decl]:
        return {d.name: d for d in self.decls}

    @cached_property
    def producers(self) -> dict[str, Op]:
        return {r: op for op in self.ops for r in op.results}

    def type_of(self, value: str) -> TensorType:
        return self.producers[value].type_of(value)

    @cached_property
    def users(self) -> dict[str, tuple[Op, ...]]:
        out: dict[str, list[Op]] = {r: [] for r in self.producers}
        for op in self.ops:
            for v in op.operands:
                out.setdefault(v, []).append(op)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def inputs(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.has(BlockInput))

    @property
    def output(self) -> Op | None:
        return next((op for op in self.ops if op.has(Sink)), None)


@dataclass(frozen=True)
class Program:
    """A typed file: its dims, constants and blocks."""

    filename: str = field(compare=False)
    dims: tuple[Axis, ...]
    consts: tuple[Const, ...]
    blocks: tuple[Block, ...]

    @cached_property
    def dim_map(self) -> dict[str, Axis]:
        return {d.name: d for d in self.dims}

    @cached_property
    def block_map(self) -> dict[str, Block]:
        return {b.name: b for b in self.blocks}

    def block(self, name: str) -> Block:
        return self.block_map[name]
