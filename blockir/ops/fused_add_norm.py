"""The FusedAddNormOp kind: its fields, printing and label."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from blockir.diagnostics import Span
from blockir.ir.consts import ConstExpr, format_expr
from blockir.ir.op import OpBase, SPAN, role_field, factor_text
from blockir.ir.traits import MultiResult, Normalizes, ResidualSum, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class FusedAddNormOp(OpBase):
    """``residual = shortcut_scale * shortcut + branch_scale * dropout(branch)``;
    ``normalized = norm(residual)``. Two named results, in ABI order."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Normalizes, ResidualSum, MultiResult, RowLocal})

    normalized: str = role_field("result")
    residual: str = role_field("result")
    type: TensorType = field()
    residual_type: TensorType = field()
    decl: str = role_field("decl")
    branch: str = role_field("value")
    shortcut: str = role_field("value")
    p: ConstExpr | None = role_field("expr", default=None)
    mask: str = "element"
    branch_factor: ConstExpr | None = role_field("expr", default=None)
    branch_param: str | None = role_field("decl", default=None)
    shortcut_factor: ConstExpr | None = role_field("expr", default=None)
    site: str | None = role_field("result", default=None)  # name of the absorbed dropout: its RNG identity is kept
    span: Span = field(**SPAN)

    @property
    def result(self) -> str:  # type: ignore[override]
        return self.normalized

    @property
    def results(self) -> tuple[str, ...]:
        return (self.normalized, self.residual)

    def type_of(self, value: str) -> TensorType | None:
        return self.residual_type if value == self.residual else self.type

    def text(self) -> str:
        extra = []
        if self.shortcut_factor is not None:
            extra.append(f"shortcut_scale={factor_text(self.shortcut_factor)}")
        if self.branch_factor is not None:
            extra.append(f"branch_scale={factor_text(self.branch_factor)}")
        if self.branch_param is not None:
            extra.append(f"branch_scale={self.branch_param}")
        if self.p is not None:
            extra.append(f"p={format_expr(self.p)}")
            if self.mask != "element":
                extra.append(f"mask={self.mask}")
        tail = "".join(", " + e for e in extra)
        return (f"{self.normalized}, {self.residual} = fused_add_norm[{self.decl}]"
                f"(branch={self.branch}, shortcut={self.shortcut}{tail})")

    def terms(self) -> tuple[str, ...]:
        return (self.shortcut, self.branch)

    def norm_input(self) -> str | None:
        return self.residual

    def shortcut_scale(self) -> ConstExpr | None:
        return self.shortcut_factor

    def branch_scale(self) -> ConstExpr | None:
        return self.branch_factor


# ---- analysis hooks (label, layout, keys, structure): registered into blockir.ir.hooks tables
# (keep this block and the next one apart: each stage adds its own registrations below its heading)


# ---- lowering hooks (fx lowering, fused lowering, cost): registered into blockir.ir.hooks tables
# (each hook receives the stage's builder; none imports torch)
