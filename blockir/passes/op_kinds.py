"""The ops passes build, and the kinds they recognise by their traits: the one file of passes/ that names op classes.

A pass asks ``op.has(Scales)`` or one of the questions below; it never lists op classes, so a new kind
that states the right traits is rewritten like the kinds it resembles.
"""
from __future__ import annotations

from typing import Any

from blockir.ir.consts import ConstExpr
from blockir.ir.op import OpBase
from blockir.ir.traits import Combines, Normalizes, ResidualSum
from blockir.ir.types import TensorType
from blockir.ops import BiasOp, FusedAddNormOp, NormOp, Op, ScaleOp


def plain_norm(op: OpBase) -> bool:
    """A norm applied to one value (``op.operand``), not fused with the residual add before it."""
    return op.has(Normalizes) and not op.has(ResidualSum)


def fused_boundary(op: OpBase) -> bool:
    """An add and the norm of its sum as one op."""
    return op.has(Normalizes) and op.has(ResidualSum)


def residual_add(op: OpBase) -> bool:
    """A plain add of two tensors (``op.lhs``, ``op.rhs``), not fused with a norm."""
    return op.has(ResidualSum) and op.has(Combines)


def scale(result: str, type: TensorType, operand: str, *, factor: ConstExpr | None = None,
          param: str | None = None) -> Op:
    """``factor * operand`` or ``param * operand``."""
    return ScaleOp(result, type, operand, factor=factor, param=param)


def norm(result: str, type: TensorType, decl: str, operand: str) -> Op:
    """The norm declaration ``decl`` applied to ``operand``."""
    return NormOp(result, type, decl, operand)


def bias(result: str, type: TensorType, operand: str, param: str) -> Op:
    """``operand + param``, a learned bias declaration."""
    return BiasOp(result, type, operand, param)


def fused_add_norm(normalized: str, residual: str, type: TensorType, residual_type: TensorType, decl: str,
                   branch: str, shortcut: str, **scales: Any) -> Op:
    """``normalized = decl(residual)``, ``residual = shortcut + branch`` with the chain's dropout and scales
    (``p``, ``mask``, ``branch_factor``, ``branch_param``, ``shortcut_factor``, ``site``, ``span``)."""
    return FusedAddNormOp(normalized, residual, type, residual_type, decl, branch, shortcut, **scales)
