"""The typed, immutable intermediate representation."""
from blockir.ir.consts import ConstExpr
from blockir.ir.decls import Decl, ExternDecl, InstanceDecl, KindDecl, Param
from blockir.ir.ops import (ActivationOp, AddOp, BiasOp, CallOp, CastOp, ComplementOp, ConcatOp, DropoutOp,
                            FusedAddNormOp, InputOp, LayerDropOp, MulOp, NormOp, Op, OutputOp, ScaleOp, SubOp, ZerosOp)
from blockir.ir.program import Block, Const, Program
from blockir.ir.types import Axis, DType, Role, TensorType

__all__ = ["ActivationOp", "AddOp", "Axis", "BiasOp", "Block", "CallOp", "CastOp", "ComplementOp", "ConcatOp", "Const", "ConstExpr", "DType",
           "Decl", "DropoutOp", "ExternDecl", "FusedAddNormOp", "InputOp", "InstanceDecl", "KindDecl", "LayerDropOp", "MulOp", "NormOp", "Op",
           "OutputOp", "Param", "Program", "Role", "ScaleOp", "SubOp", "TensorType", "ZerosOp"]
