"""The ExternAddNormOp kind: a call of an extern that states the fused add+norm contract.

``n, h = add_norm(u, x)`` of ``add_norm: extern(…; norm=rmsnorm(D), residual=1) -> (…, …)`` calls the
bound module, as any extern call does, but its declared meaning is an add followed by a norm: the
result the contract names ``residual`` is the sum, which continues the stream, and the other is the
normalized sum. Stating the AddNorm traits lets every residual analysis and verifier read it as it
reads the fusion pass's ``fused_add_norm``, so a stream continued from the normalized result is the
same error (E0412) wherever the add was written.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from blockir.diagnostics import Span
from blockir.ir.hooks import BUILD, COST, EQUIVALENCE, FX_LOWERING, KEYS, LAYOUT
from blockir.ir.op import OpBase, SPAN, role_field
from blockir.ir.traits import AddNorm, MultiResult, Normalizes, ResidualSum, RowLocal, Trait
from blockir.ir.types import TensorType


@dataclass(frozen=True)
class ExternAddNormOp(OpBase):
    """``normalized, residual`` (in the order the module returns them) ``= decl(branch, shortcut)``."""

    TRAITS: ClassVar[frozenset[type[Trait]]] = frozenset({Normalizes, ResidualSum, MultiResult, RowLocal, AddNorm})

    normalized: str = role_field("result")
    residual: str = role_field("result")
    type: TensorType = field()
    residual_type: TensorType = field()
    decl: str = role_field("decl")
    branch: str = role_field("value")
    shortcut: str = role_field("value")
    residual_first: bool = False  # the module returns (residual, normalized)
    span: Span = field(**SPAN)
    # nothing scales or drops the terms inside the call: the readers of a fused add+norm ask these
    p: ClassVar[None] = None
    branch_factor: ClassVar[None] = None
    branch_param: ClassVar[None] = None
    shortcut_factor: ClassVar[None] = None
    site: ClassVar[None] = None

    @property
    def result(self) -> str:  # type: ignore[override]
        return self.normalized

    @property
    def results(self) -> tuple[str, ...]:
        return (self.residual, self.normalized) if self.residual_first else (self.normalized, self.residual)

    def type_of(self, value: str) -> TensorType | None:
        return self.residual_type if value == self.residual else self.type

    def label(self) -> str:
        return f"'{self.decl}(…)'"

    def text(self) -> str:
        return f"{', '.join(self.results)} = {self.decl}({self.branch}, {self.shortcut})"

    def terms(self) -> tuple[str, ...]:
        return (self.shortcut, self.branch)

    def norm_input(self) -> str | None:
        return self.residual

    def shortcut_scale(self) -> None:
        return None

    def branch_scale(self) -> None:
        return None


@BUILD.register(ExternAddNormOp, "extern_add_norm(u, x)")
def _build(ctx: Any, result: str, span: Any, decl: str, args: tuple[str, str], results: tuple[str, str],
           t: TensorType, residual: int) -> ExternAddNormOp:
    """``results`` are the call's names in the module's order; ``residual`` is the contract's index of the sum."""
    return ExternAddNormOp(results[1 - residual], results[residual], t, t, decl, args[0], args[1],
                           residual_first=residual == 0, span=span)


@LAYOUT.register(ExternAddNormOp)
def _layout(op: ExternAddNormOp, ctx: Any, analyser: Any) -> None:
    ctx.keep(op, op.shortcut)


@KEYS.register(ExternAddNormOp)
def _keys(op: ExternAddNormOp, block: Any, arg: int) -> Any:
    return op.residual_type


@EQUIVALENCE.register(ExternAddNormOp)
def _equivalence(op: ExternAddNormOp, builder: Any) -> tuple:
    return builder.label(op, "extern_add_norm")


@FX_LOWERING.register(ExternAddNormOp)
def _lower(op: ExternAddNormOp, b: Any) -> None:
    node = b.module(op.decl, (b.env[op.branch], b.env[op.shortcut]), None, with_ctx=True)
    b.unpack(node, op.results)


@COST.register(ExternAddNormOp)
def _cost(op: ExternAddNormOp, c: Any) -> None:
    """An extern's internals are not counted, as for any branch."""
