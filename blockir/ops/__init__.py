"""The op kinds, one file each; importing this package registers every kind's hooks."""
from __future__ import annotations

from typing import Union

from blockir.ops.activation import ActivationOp
from blockir.ops.add import AddOp
from blockir.ops.bias import BiasOp
from blockir.ops.call import CallOp
from blockir.ops.cast import CastOp
from blockir.ops.complement import ComplementOp
from blockir.ops.concat import ConcatOp
from blockir.ops.dropout import DropoutOp
from blockir.ops.fused_add_norm import FusedAddNormOp
from blockir.ops.input import InputOp
from blockir.ops.layer_drop import LayerDropOp
from blockir.ops.mul import MulOp
from blockir.ops.norm import NormOp
from blockir.ops.output import OutputOp
from blockir.ops.scale import ScaleOp
from blockir.ops.sub import SubOp
from blockir.ops.zeros import ZerosOp

Op = Union[InputOp, NormOp, CallOp, ActivationOp, DropoutOp, LayerDropOp, ScaleOp, BiasOp, MulOp, ComplementOp, AddOp, CastOp,
           ConcatOp, SubOp, FusedAddNormOp, OutputOp, ZerosOp]

__all__ = ["InputOp", "NormOp", "CallOp", "ActivationOp", "DropoutOp", "LayerDropOp", "ScaleOp", "BiasOp", "MulOp", "ComplementOp", "SubOp", "AddOp", "CastOp", "ConcatOp", "FusedAddNormOp", "OutputOp", "ZerosOp", "Op"]
