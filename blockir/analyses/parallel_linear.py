"""The tensor-parallel plan of a ``linear`` declared on its own, outside a branch.

Two linears written out as an MLP (``linear_pairs.py``) split as the ``mlp`` kind does: the widening one by
output columns, reading full rows of the stream (a branch input's gather, and its gradient's reduction), the
narrowing one by input rows, its pending sum reduced to the stream's layout (Shoeybi et al., 2019). Under the
hidden layout any other linear reads the stream's feature shard (OPT's ``project_in`` and ``project_out``), so
it is split by input rows as a row-parallel projection is, each rank holding its columns of the weight, and
its pending sum is reduced onto the stream's layout. Elsewhere a lone linear is left to the plan's defaults
(replicated, computing on the rows each rank holds), and so is every linear under the context layout, whose
ranks split the rows, never the features: a pair there reads each row alone and sends nothing.
"""
from __future__ import annotations

from typing import Any

from blockir.analyses.sizes import Sizes
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block


def plan_linear(planner: Any, d: KindDecl, path: str, layer: str, sizes: Sizes, block: Block) -> bool:
    """Place ``d`` (``planner`` is the plan's ``_Planner``) where a rule above applies; False where none does."""
    if planner.layout == "context":
        return False
    role = planner.pairs(block).get(d.name)
    if role == "columns":
        planner.divisible(d, "output features", sizes.dim(d.arg("out_dim")))
        planner.styled(path, "pair_columns", d.kind)
        planner._param(f"{path}.weight", "shard(0)")
        if d.arg("bias"):
            planner._param(f"{path}.bias", "shard(0)")
        planner._gathered(layer, path, partial=True)
        return True
    if role is None and planner.layout != "hidden":
        return False
    elements = None
    if role is None:
        planner.divisible(d, "input features", sizes.dim(d.arg("in_dim")))
        planner.divisible(d, "output features", sizes.dim(d.arg("out_dim")))
        elements = planner.elements // sizes.dim(planner.stream_axis) * sizes.dim(d.arg("out_dim"))
    planner.styled(path, "rowwise", d.kind)
    planner._param(f"{path}.weight", "shard(1)")
    if d.arg("bias"):
        planner._param(f"{path}.bias", "replicate")
    planner._reduced(layer, path, elements)
    return True
