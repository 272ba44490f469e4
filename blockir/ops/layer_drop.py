"""The LayerDropOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.ir.consts import format_expr
from blockir.ir.hooks import BUILD, EQUIVALENCE, FX_LOWERING
from blockir.ir.traits import DropsLayer, Trait
from blockir.ops.dropout import DropoutOp


@dataclass(frozen=True)
class LayerDropOp(DropoutOp):
    """Layer dropout (LayerDrop): one draw per layer and step, shared by the whole batch and by every
    ``layer_drop`` of the layer, so a dropped layer's updates all vanish and the layer is skipped.

    Kept updates are not rescaled. It stays a dropout site for every analysis (the identity in
    inference, a branch modifier); only its mask, scale and randomness differ.
    """

    TRAITS: ClassVar[frozenset[type[Trait]]] = DropoutOp.TRAITS | frozenset({DropsLayer})

    mask: str = field(default="layer")

    @property
    def function(self) -> str:
        return "layer_drop"

    def text(self) -> str:
        return f"{self.result} = layer_drop({self.operand}, p={format_expr(self.p)})"


@EQUIVALENCE.register(LayerDropOp)
def _equivalence(op: LayerDropOp, builder: Any) -> tuple:
    return builder.label(op, "layer_drop")  # one draw per layer: no name keys its mask


@BUILD.register(LayerDropOp, "layer_drop(x)")
def _build(ctx: Any, result: str, span: Any, operand: str, p: Any, mask: str) -> LayerDropOp:
    """Layer drop: its mask is always the whole layer, whatever the construct's default."""
    return LayerDropOp(result, ctx.type_of(operand), operand, p, span=span)


@FX_LOWERING.register(LayerDropOp)
def _lower(op: LayerDropOp, b: Any) -> None:
    p = float(b.value(op.p))
    if p == 0.0:
        b.bind(op.result, b.env[op.operand])
        return
    # keyed by (seed, layer) alone: every layer_drop of one layer shares its draw
    b.fn(b.rt.layer_drop_site, (b.env[op.operand], p, b.training_flag(), b.seed_node(), b.layer_index()),
         op.result, wrapped=True)
