"""The typed, immutable intermediate representation."""
from blockir.ir.consts import ConstExpr
from blockir.ir.decls import Decl, ExternDecl, InstanceDecl, KindDecl, Param
from blockir.ir.program import Block, Const, Program
from blockir.ir.types import Axis, DType, Role, TensorType

__all__ = ["Axis", "Block", "Const", "ConstExpr", "DType",
           "Decl", "ExternDecl", "InstanceDecl", "KindDecl",
           "Param", "Program", "Role", "TensorType"]
