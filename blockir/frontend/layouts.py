"""Placements written inside a type's brackets → IR layouts, with located errors.

``[B, S, D; tp=shard(S)]`` places the value over mesh axis ``tp`` (declared
``dim tp: mesh``) split along S; ``tp=replicate`` and ``tp=partial`` take no axis.
"""
from __future__ import annotations

from typing import Callable

from blockir.diagnostics import Span
from blockir.frontend import ast
from blockir.frontend.scope import suggest
from blockir.ir.types import PLACEMENT_KINDS, Axis, Layout, Placement, Role, TensorType

Report = Callable[..., None]


def build_layout(t: ast.TypeAst, tensor: TensorType | None, dims: dict[str, Axis], err: Report) -> Layout | None:
    """The layout of a written type, or None after reporting what is wrong with it."""
    out: list[Placement] = []
    seen: dict[str, Span] = {}
    meshes = [name for name, d in dims.items() if d.role is Role.MESH]
    for p in t.layout:
        if p.mesh not in dims:
            err("E0101", f"undefined mesh axis '{p.mesh}'", p.span, suggest(p.mesh, meshes) or
                f"declare it: dim {p.mesh}: mesh")
            return None
        if dims[p.mesh].role is not Role.MESH:
            err("E0111", f"'{p.mesh}' is a {dims[p.mesh].role.value} axis, not a mesh axis", p.span,
                "a placement names a mesh axis declared as: dim tp: mesh")
            return None
        if p.mesh in seen:
            err("E0102", f"mesh axis '{p.mesh}' is placed twice", p.span)
            return None
        seen[p.mesh] = p.span
        if p.kind not in PLACEMENT_KINDS:
            err("E0107", f"a placement is one of {', '.join(PLACEMENT_KINDS)}, got '{p.kind}'", p.span,
                suggest(p.kind, PLACEMENT_KINDS))
            return None
        if (p.kind == "shard") != (p.axis is not None):
            err("E0106", "shard names the tensor axis it splits: shard(S)" if p.kind == "shard"
                else f"{p.kind} takes no axis", p.span)
            return None
        if tensor is not None and p.axis is not None and p.axis not in tensor.names:
            err("E0111", f"'{p.mesh}' shards {p.axis}, which is not an axis of {tensor}", p.span,
                f"shard one of {', '.join(tensor.names)}")
            return None
        out.append(Placement(p.mesh, p.kind, p.axis))
    return tuple(out)
