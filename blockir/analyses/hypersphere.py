"""Which parameters nGPT keeps on the unit sphere, and along which axis.

nGPT (Loshchilov et al., arXiv:2410.01131) normalizes every embedding-dimension
vector of a matrix after each optimizer step: the rows of a matrix that reads the
stream (queries, keys, values, MLP inputs, embedding and head tables, stored
``[out, D]``) and the columns of one that writes it (attention and MLP outputs,
stored ``[D, in]``). Normalizing every matrix along its last axis would constrain
the wrong vectors of the writers, so the axis is part of the model's manifest.
A block opts in with ``l2norm(D, hypersphere=true)``, and its own matrices are projected.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from blockir.analyses.summaries import call_graph
from blockir.ir.decls import KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Block, Program

# the matrices of each built-in branch: (role, whether it writes the stream), for each layout
ROLES = {"self_attention": {"none": (("q", False), ("k", False), ("v", False), ("o", True))},
         "mlp": {False: (("fc1", False), ("fc2", True))},
         "gated_mlp": {False: (("gate", False), ("up", False), ("down", True)),
                       True: (("gate_up", False), ("down", True))}}
ROLES["cross_attention"] = ROLES["self_attention"]


@dataclass(frozen=True)
class SphereParameter:
    key: str  # relative to the block that declares the sphere
    axis: int  # the axis of the stored weight that runs along the sphere's dim


def sphere_dims(block: Block) -> tuple[str, ...]:
    """The dims a block declares its stream's sphere over (``l2norm(D, hypersphere=true)``)."""
    return tuple(d.arg("axes")[-1] for d in block.decls
                 if isinstance(d, KindDecl) and d.category == "norm" and d.arg("hypersphere"))


def _matrices(decl: KindDecl, dim: str) -> list[SphereParameter]:
    if decl.kind == "linear":
        axis = 1 if decl.arg("in_dim") == dim else 0 if decl.arg("out_dim") == dim else None
        return [] if axis is None else [SphereParameter(f"{decl.name}.weight", axis)]
    if decl.kind in ("embedding", "head"):
        return [SphereParameter(f"{decl.name}.weight", 1)]
    if decl.kind not in ROLES:
        return []
    layout = decl.arg("fused")
    if decl.kind.endswith("attention"):
        roles = ROLES[decl.kind]["none"] if layout == "none" else (("qkv", False), ("o", True))
    else:
        roles = ROLES[decl.kind][bool(layout)]
    names = layer_names(decl.kind, dict(decl.args))
    flip = 1 if decl.arg("conv1d") else 0  # GPT-2's Conv1D stores [in, out]
    return [SphereParameter(f"{decl.name}.{names[role]}.weight", (0 if writes else 1) ^ flip) for role, writes in roles]


def sphere_parameters(block: Block) -> tuple[SphereParameter, ...]:
    """Every weight of ``block`` that nGPT projects after a step, with the axis it normalizes."""
    dims = sphere_dims(block)
    if not dims:
        return ()
    return tuple(p for d in block.decls if isinstance(d, KindDecl) for p in _matrices(d, dims[0]))


def on_sphere(program: Program, name: str) -> bool:
    """Whether block ``name``, or a block it calls, keeps its stream on a hypersphere (an nGPT run)."""
    reachable = nx.descendants(call_graph(program), name) | {name}
    return any(sphere_dims(program.block(b)) for b in reachable)
