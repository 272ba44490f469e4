"""The CallOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, KEYS, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Calls, MultiResult, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class CallOp(OpBase):
    """A branch, linear, activation declaration, extern, block or stack applied to values."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Calls, MultiResult})

    result: str = role_field("result")
    type: TensorType = field()
    decl: str = role_field("decl")
    args: tuple[str, ...] = role_field("value")
    span: Span = field(**SPAN)
    # the carried streams a multi-result block (or a score-carrying attention) returns after the hidden state
    more: tuple[str, ...] = role_field("result", default=())
    more_types: tuple[TensorType, ...] = ()

    @property
    def results(self) -> tuple[str, ...]:
        return (self.result, *self.more)

    def type_of(self, value: str) -> TensorType | None:
        return self.more_types[self.more.index(value)] if value in self.more else self.type

    def label(self) -> str:
        return f"'{self.decl}(…)'"

    def text(self) -> str:
        return f"{', '.join(self.results)} = {self.decl}({', '.join(self.args)})"


@LAYOUT.register(CallOp)
def _layout(op: CallOp, ctx: Any, analyser: Any) -> None:
    ctx.values[op.result] = analyser.call(ctx, op)


@KEYS.register(CallOp)
def _keys(op: CallOp, block: Any, arg: int) -> Any:
    return block.type_of(op.args[arg]) if len(op.args) > arg else None


@EQUIVALENCE.register(CallOp)
def _equivalence(op: CallOp, builder: Any) -> tuple:
    return builder.label(op, "call")


@BUILD.register(CallOp, "decl(x)")
def _build(ctx: Any, result: str, span: Any, decl: str, args: tuple[str, ...], t: TensorType,
           more: tuple[str, ...] = (), more_types: tuple[TensorType, ...] = ()) -> CallOp:
    """A declaration applied to values; its result type ``t`` (and those of the carried streams it also
    returns) follow from the declaration, which the frontend reads."""
    return CallOp(result, t, decl, args, span=span, more=more, more_types=more_types)


@FX_LOWERING.register(CallOp)
def _lower(op: CallOp, b: Any) -> None:
    decl = b.decl(op.decl)
    if isinstance(decl, InstanceDecl) and decl.count is not None:
        b.value(decl.count)  # the number of layers is part of what the graph was built for
    # a linear or an activation declaration reads no context; a branch, sub-block, stack or extern (whose
    # BoundExtern calls the adapter) is handed the forward's
    with_ctx = not (isinstance(decl, KindDecl) and decl.category in ("linear", "activation"))
    ssa = None if op.more else op.result  # a call with carried results returns a tuple, taken apart below
    node = b.module(op.decl, tuple(b.env[a] for a in op.args), ssa, with_ctx=with_ctx)
    if op.more:
        b.unpack(node, op.results)


@COST.register(CallOp)
def _cost(op: CallOp, c: Any) -> None:
    """A branch's internals are not counted; the ledger walks a called sub-block or stack itself."""
