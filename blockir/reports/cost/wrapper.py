"""A block's own residual-wrapper ops, each counted by its kind's ``COST`` hook.

The wrapper ops are the adds, scales, dropouts, casts and norms that are not inside a branch;
branch internals (attention, MLP, projections, activations) are out of scope. Each kind's hook, in
``blockir/ops/<kind>.py``, receives a :class:`WrapperCost` and states what the op moves through
memory and what backward keeps of it, with the methods below; the counts are for the training
forward (dropout active where p > 0, norms writing their row statistics).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from blockir.norms import family
from blockir.analyses.sizes import Env, value
from blockir.analyses.structure import interpolation, wrapper
from blockir.ir import consts as C
from blockir.ir.decls import Decl, KindDecl
from blockir.ir.hooks import COST
from blockir.ir.program import Block
from blockir.ir.traits import Normalizes
from blockir.ir.types import DType
from blockir.reports.cost.counts import (REDUCTIONS, STATS, STATS_ITEMSIZE, FusedBoundary, Tally, itemsize, nbytes,
                                         norm_parameters, rows, size)


@dataclass
class WrapperCost:
    """The tallies of a block's own wrapper ops, built op by op by their ``COST`` hooks."""

    block: Block
    env: Env
    dtype: DType  # of every value whose type leaves it open
    bytes_moved: int = 0
    saved: dict[str, int] = field(default_factory=dict)  # value -> bytes: a value saved twice is kept once
    stats: int = 0
    forward: int = 0
    backward: int = 0

    # ---- what a hook reads

    def decl(self, name: str) -> Decl:
        return self.block.decl_map[name]

    def nbytes(self, v: str) -> int:
        """Bytes of value ``v`` at its type."""
        return nbytes(self.block.type_of(v), self.env, self.dtype)

    def rows(self, v: str) -> int:
        """Rows of value ``v``: its elements over its last axis."""
        return rows(self.block.type_of(v), self.env)

    def active(self, p: C.ConstExpr) -> bool:
        """Whether a dropout probability is not zero at these sizes (and this layer)."""
        return value(p, self.env) != 0

    def param_elements(self, name: str) -> int:
        """Elements of a learned gain or bias declaration: one number, or one per channel of its axis."""
        gain = self.decl(name)
        return 1 if gain.kind == "scalar" else size(gain.arg("axis"), self.env)  # type: ignore[union-attr]

    def param_bytes(self, name: str, like: str) -> int:
        """Bytes of a learned gain or bias declaration at the dtype of ``like``."""
        return self.param_elements(name) * itemsize(self.block.type_of(like), self.dtype)

    def norm_parameter_bytes(self, name: str, like: str) -> int:
        """Bytes of norm declaration ``name``'s parameters, at the dtype of its input ``like``."""
        decl = self.decl(name)
        assert isinstance(decl, KindDecl)
        return norm_parameters(decl, self.env) * itemsize(self.block.type_of(like), self.dtype)

    def norm_statistics(self, name: str, n_rows: int) -> int:
        """Bytes of the row statistics norm declaration ``name`` writes over ``n_rows`` rows."""
        decl = self.decl(name)
        assert isinstance(decl, KindDecl)
        accum = decl.arg("accum")
        return STATS[decl.kind] * n_rows * (DType(accum).itemsize if accum else STATS_ITEMSIZE)

    def boundary(self, norm: str, branch: str, residual: str, normalized: str, scale: str | None) -> FusedBoundary:
        """One fused add+norm call: ``branch`` added to the residual, normalized by ``norm``, with a learned
        branch ``scale`` (a scalar or a vector over the channels) when there is one."""
        decl = self.decl(norm)
        assert isinstance(decl, KindDecl)
        residual_type = self.block.type_of(residual)
        elements = self.param_elements(scale) if scale is not None else 0
        fam = family(decl)
        return FusedBoundary(decl.kind, rows(residual_type, self.env), size(residual_type.axes[-1].name, self.env),
                             itemsize(self.block.type_of(branch), self.dtype), itemsize(residual_type, self.dtype),
                             itemsize(self.block.type_of(normalized), self.dtype),
                             weight=fam.weight(decl), bias=fam.bias(decl), scale_elements=elements)

    # ---- what a hook counts

    def moves(self, *values: str) -> None:
        """Each value is read or written once at its type."""
        self.bytes_moved += sum(self.nbytes(v) for v in values)

    def moves_bytes(self, n: int) -> None:
        self.bytes_moved += n

    def keeps(self, v: str, n: int | None = None) -> None:
        """Backward keeps value ``v`` (``n`` bytes of it, all of it by default)."""
        self.saved[v] = self.nbytes(v) if n is None else n

    def keeps_statistics(self, n: int) -> None:
        """Backward keeps ``n`` bytes of row statistics."""
        self.stats += n

    def reduces(self, norm_family: str, n_rows: int) -> None:
        """One application of a norm of ``norm_family`` over ``n_rows`` rows: its row reductions."""
        f, b = REDUCTIONS[norm_family]
        self.forward += f * n_rows
        self.backward += b * n_rows


def _internal(block: Block) -> set[int]:
    """Ops inside a branch's computation: everything between its pre-norms and its output modifiers."""
    out: set[int] = set()
    for sub in wrapper(block).sublayers:
        step = interpolation(block, sub)  # nGPT's t - x belongs to the update, like a scale does
        for b in sub.branches:
            edge = {id(op) for op in (*b.modifiers, *b.pre_norms, b.out_norm, step) if op is not None}
            out |= {id(op) for op in b.ops} - edge
    return out


def own_tally(block: Block, env: Env, dtype: DType) -> Tally:
    """The tally of ``block``'s own ops (its sub-blocks and stacks are the walk's)."""
    internal = _internal(block)
    own = WrapperCost(block, env, dtype)
    for op in block.ops:
        if id(op) not in internal:
            COST.of(op)(op, own)
    # a fused add+norm root is one boundary, whatever adds it absorbed
    adds = sum(1 if s.root.has(Normalizes) else len(s.adds) for s in wrapper(block).sublayers)
    params: dict[str, int] = {}
    for d in block.decls:
        if isinstance(d, KindDecl) and d.category == "norm":
            params[d.kind] = params.get(d.kind, 0) + norm_parameters(d, env)
    return Tally(adds, params, own.forward, own.backward, own.bytes_moved, sum(own.saved.values()) + own.stats)
