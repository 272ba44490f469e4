"""The DropoutOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.consts import ConstExpr, format_expr
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import Elementwise, Modifier, RowLocal, Stochastic, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class DropoutOp(OpBase):
    """Inverted dropout; ``mask`` says which axes one draw covers (element, row, channel, sample)."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Stochastic, Modifier, Elementwise, RowLocal})

    result: str = role_field("result")
    type: TensorType = field()
    operand: str = role_field("value")
    p: ConstExpr = role_field("expr")
    mask: str = field()
    span: Span = field(**SPAN)

    @property
    def function(self) -> str:
        """The built-in function that writes it."""
        return "drop_path" if self.mask == "sample" else "dropout"

    def label(self) -> str:
        return f"'{self.function}(…)'"

    def text(self) -> str:
        p = format_expr(self.p)
        if self.mask == "sample":
            return f"{self.result} = drop_path({self.operand}, p={p})"
        mask = "" if self.mask == "element" else f", mask={self.mask}"
        return f"{self.result} = dropout({self.operand}, p={p}{mask})"


@LAYOUT.register(DropoutOp)
def _layout(op: DropoutOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.operand)


@EQUIVALENCE.register(DropoutOp)
def _equivalence(op: DropoutOp, builder: Any) -> tuple:
    return builder.label(op, "dropout", site=op.result)  # its own name keys its mask


@BUILD.register(DropoutOp, "dropout(x)", "drop_path(x)")
def _build(ctx: Any, result: str, span: Any, operand: str, p: ConstExpr, mask: str) -> DropoutOp:
    """Dropout with a checked probability ``p``; drop-path is the mask ``sample``."""
    return DropoutOp(result, ctx.type_of(operand), operand, p, mask, span=span)


@FX_LOWERING.register(DropoutOp)
def _lower(op: DropoutOp, b: Any) -> None:
    p = float(b.value(op.p))
    if p == 0.0:
        b.bind(op.result, b.env[op.operand])
        return
    # the mask is keyed by (seed, layer, site): the site is the value's name, so fusion keeps it
    b.fn(b.rt.dropout_site, (b.env[op.operand], p, op.mask, b.training_flag(), b.seed_node(), b.layer_index(),
                             b.rt.site_id(op.result)), op.result, wrapped=True)


@COST.register(DropoutOp)
def _cost(op: DropoutOp, c: Any) -> None:
    if c.active(op.p):  # p = 0 lowers to nothing; an active mask is regenerated, never stored
        c.moves(op.operand, op.result)
