"""The LayerDropOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.ir.consts import format_expr
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


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)
