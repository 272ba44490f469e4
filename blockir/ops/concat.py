"""The ConcatOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.consts import Bin
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Concatenates, RowLocal, Trait
from blockir.ir.types import Axis, TensorType


@dataclass(frozen=True)
class ConcatOp(OpBase):
    """Concatenation along the last axis (legal syntax; the residual verifier flags it on the stream)."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Concatenates, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    args: tuple[str, ...] = role_field("value")
    span: Span = field(**SPAN)

    def label(self) -> str:
        return "'concat(…)'"

    def text(self) -> str:
        return f"{self.result} = concat({', '.join(self.args)})"


@LAYOUT.register(ConcatOp)
def _layout(op: ConcatOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.args[0])


@EQUIVALENCE.register(ConcatOp)
def _equivalence(op: ConcatOp, builder: Any) -> tuple:
    return builder.label(op, "concat")


@BUILD.register(ConcatOp, "concat(…)")
def _build(ctx: Any, result: str, span: Any, args: tuple[str, ...]) -> ConcatOp | None:
    """Tensors joined along their last axes: the joined axis is named ``a+b`` and sized by the sum of sizes."""
    types = [ctx.type_of(a) for a in args]
    lasts = [t.last for t in types if t.last is not None]
    if len(lasts) != len(types):
        ctx.err("E0111", "'concat' needs tensors with at least one axis", span)
        return None
    size = None
    if all(a.size is not None for a in lasts):
        size = lasts[0].size
        for a in lasts[1:]:
            size = Bin("+", size, a.size)
    joined = Axis("+".join(a.name for a in lasts), lasts[0].role, size)
    return ConcatOp(result, types[0].with_last(joined), args, span=span)


@FX_LOWERING.register(ConcatOp)
def _lower(op: ConcatOp, b: Any) -> None:
    b.fn(b.rt.cat, (tuple(b.env[a] for a in op.args),), op.result, {"dim": -1})


@COST.register(ConcatOp)
def _cost(op: ConcatOp, c: Any) -> None:
    """Not a residual-wrapper op: the ledger does not count it."""
