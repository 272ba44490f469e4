"""What the residual analysis finds in a block: its sublayers, their branches and the stream they update.

:func:`blockir.analyses.structure.wrapper` builds them; every verifier, report and rewrite that
reasons about topology reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from blockir.ir.traits import AddNorm, Product, Scales, Stochastic
from blockir.ops import Op


@dataclass(frozen=True)
class Branch:
    """One update joining a residual add: everything between the stream and the add."""

    leaf: str  # the operand of the add it produces
    ops: tuple[Op, ...]  # its ops, in program order
    call: Op | None  # the principal computation (attention, MLP, extern, …)
    kind: str  # causal_self_attention, cross_attention, mlp, gated_mlp, moe, linear, extern, block, …
    pre_norms: tuple[Op, ...]  # norms (or fused add+norms) the branch reads the stream through
    out_norm: Op | None  # norm on the branch output before the add
    modifiers: tuple[Op, ...]  # scales, dropouts and casts between the computation and the add, add-side first
    memory: tuple[str, ...]  # non-state block inputs it reads

    @property
    def name(self) -> str:
        return getattr(self.call, "decl", None) or getattr(self.call, "fn", None) or self.leaf

    @property
    def label(self) -> str:
        """The kind, naming the declaration when the kind alone says little (externs, blocks)."""
        return f"{self.kind}:{self.name}" if self.kind in ("extern", "block", "stack") else self.kind

    @property
    def scales(self) -> tuple[Op, ...]:
        return tuple(op for op in self.modifiers if op.has(Scales))

    @property
    def dropouts(self) -> tuple[Op, ...]:
        return tuple(op for op in self.modifiers if op.has(Stochastic))

    @property
    def gates(self) -> tuple[Op, ...]:
        """Gate products between the computation and the add."""
        return tuple(op for op in self.modifiers if op.has(Product))


@dataclass(frozen=True)
class Sublayer:
    """One residual update of the stream: ``state → (shortcut, branches) → add [→ post-norm]``."""

    root: Op  # the add (ResidualSum) the update ends in
    adds: tuple[Op, ...]  # the whole sum tree, root last
    state: str  # the stream value the update starts from
    shortcut: str | None  # the add operand carrying the shortcut
    shortcut_ops: tuple[Op, ...]  # ops from the state to the shortcut operand, in program order
    branches: tuple[Branch, ...]
    post_norm: Op | None
    fused_post: bool = False  # a fused root whose normalized output continues the stream (Post-LN)
    leaves: tuple[str, ...] = ()  # the operands of the sum tree: the shortcut and the update operands

    @property
    def updates(self) -> tuple[str, ...]:
        """The add operands that make the update u (their sum), the shortcut excluded."""
        return tuple(v for v in self.leaves if v != self.shortcut)

    @property
    def result(self) -> str:
        """The stream value after this update."""
        if self.post_norm is not None:
            return self.post_norm.result
        if self.root.has(AddNorm):
            return self.root.normalized if self.fused_post else self.root.residual  # type: ignore[attr-defined]
        return self.root.result

    @property
    def shortcut_gates(self) -> tuple[Op, ...]:
        """Gate products on the shortcut (the ``z * x`` of a gated residual)."""
        return tuple(op for op in self.shortcut_ops if op.has(Product))

    @property
    def shortcut_scaled(self) -> bool:
        """Whether a constant multiplies the shortcut (DeepNorm's alpha), fused or not."""
        return any(op.has(Scales) and op.factor is not None for op in self.shortcut_ops) \
            or self.root.has(AddNorm) and self.root.shortcut_factor is not None  # type: ignore[attr-defined]

    @property
    def placement(self) -> str:
        """Where this update normalizes: any of pre, out, post joined by '+', or 'none'."""
        parts = [name for name, present in (
            ("pre", any(b.pre_norms for b in self.branches)),
            ("out", any(b.out_norm is not None for b in self.branches)),
            ("post", self.post_norm is not None or self.fused_post)) if present]
        return "+".join(parts) or "none"


@dataclass(frozen=True)
class Wrapper:
    state_input: str | None
    spine: tuple[str, ...]  # stream values from the state input to the returned value
    sublayers: tuple[Sublayer, ...]

    @cached_property
    def spine_set(self) -> frozenset[str]:
        return frozenset(self.spine)

    @cached_property
    def norm_sites(self) -> dict[str, str]:
        """Norm result → where it sits in its update: pre, out or post."""
        out: dict[str, str] = {}
        for sub in self.sublayers:
            for b in sub.branches:
                for n in b.pre_norms:
                    out[n.result] = "pre"
                if b.out_norm is not None:
                    out[b.out_norm.result] = "out"
            if sub.post_norm is not None:
                out[sub.post_norm.result] = "post"
            if sub.root.has(AddNorm):
                out[sub.root.normalized] = "post" if sub.fused_post else "pre"  # type: ignore[attr-defined]
        return out
