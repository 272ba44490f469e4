"""The SubOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from blockir.ir.traits import Combines, Elementwise, RowLocal, Trait
from blockir.ops.pair import TensorPair


@dataclass(frozen=True)
class SubOp(TensorPair):
    """``lhs - rhs`` of two tensors of one type: the step from a point toward a target, as in the
    normalized interpolation ``h + alpha * (t - h)`` of nGPT (Loshchilov et al., arXiv:2410.01131)."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Combines, Elementwise, RowLocal})

    SYMBOL: ClassVar[str] = "-"

    def label(self) -> str:
        return "'… - …'"

    def terms(self) -> tuple[str, ...]:
        return (self.lhs, self.rhs)


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)
