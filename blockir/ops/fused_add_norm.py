"""The FusedAddNormOp kind: its fields, traits, printing, how it is built and its hooks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.consts import ConstExpr, format_expr
from blockir.ir.hooks import COST, EQUIVALENCE, FUSED_LOWERING, KEYS, LAYOUT
from blockir.ir.op import OpBase, SPAN, factor_text, role_field
from blockir.ir.traits import AddNorm, MultiResult, Normalizes, ResidualSum, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class FusedAddNormOp(OpBase):
    """``residual = shortcut_scale * shortcut + branch_scale * dropout(branch)``;
    ``normalized = norm(residual)``. Two named results, in ABI order."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Normalizes, ResidualSum, MultiResult, RowLocal, AddNorm})

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


@LAYOUT.register(FusedAddNormOp)
def _layout(op: FusedAddNormOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.shortcut)


@KEYS.register(FusedAddNormOp)
def _keys(op: FusedAddNormOp, block: Any, arg: int) -> Any:
    return op.residual_type


@EQUIVALENCE.register(FusedAddNormOp)
def _equivalence(op: FusedAddNormOp, builder: Any) -> tuple:
    return builder.label(op, "fused_add_norm", site=op.site)  # the absorbed dropout's name keys its mask


@FUSED_LOWERING.register(FusedAddNormOp)
def _lower_fused(op: FusedAddNormOp, b: Any) -> None:
    p = float(b.value(op.p)) if op.p is not None else 0.0
    if op.branch_param is not None:
        scale: Any = b.attr(op.branch_param)
    else:
        scale = float(b.value(op.branch_factor)) if op.branch_factor is not None else None
    shortcut_scale = float(b.value(op.shortcut_factor)) if op.shortcut_factor is not None else 1.0
    seed = b.seed_node() if p > 0.0 else None
    site = b.rt.site_id(op.site) if op.site is not None else 0  # the absorbed dropout's mask, unchanged
    pair = b.fn(b.rt.fused_boundary, (b.env[op.branch], b.env[op.shortcut], b.attr(op.decl), scale,
                                      shortcut_scale, p, b.training_flag(), seed, b.layer_index(), site))
    b.unpack(pair, op.results)


@COST.register(FusedAddNormOp)
def _cost(op: FusedAddNormOp, c: Any) -> None:
    # one boundary kernel: backward keeps residual_out and the statistics, and the branch under a learned scale
    boundary = c.boundary(op.decl, op.branch, op.residual, op.normalized, op.branch_param)
    c.moves_bytes(boundary.forward_bytes())
    c.keeps(op.residual, boundary.residual_bytes)
    if boundary.scale_elements:
        c.keeps(op.branch, boundary.branch_bytes)
    c.keeps_statistics(boundary.stats_bytes)
    c.reduces(boundary.family, boundary.rows)
