"""A model's parameter count and forward matmul FLOPs in closed form, from its parameter keys.

Parameters: every parameter key's elements (buffers and schedule counters are not parameters), with a
tied head's weight counted once (it is an alias of the token embedding's). Forward matmul FLOPs: ``2 × tokens × weights`` for every projection matrix (every
two-axis key but an embedding table, which is looked up, not multiplied; a tied head multiplies
by the embedding's matrix, so it counts), plus ``4 × B × S × S × heads × head_dim`` per
self-attention (the ``Q Kᵀ`` scores and ``P V`` over every query-key pair, as a dense kernel
computes them; the causal half is not discounted). Norms, activations and the softmax are not
FLOPs of a matmul and are left out.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from blockir.analyses.keys import param_keys
from blockir.ir.decls import KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Program
from blockir.ir.types import Role


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    matmul_flops: int  # forward


def model_size(program: Program, name: str, sizes: Mapping[str, int]) -> ModelSize:
    """Counts for block or model ``name``; ``sizes`` holds the batch and sequence sizes (and any open dim)."""
    table = param_keys(program, name, dict(sizes))
    tokens = math.prod(sizes.get(a.name, 1) for a in program.dims if a.role in (Role.BATCH, Role.SEQ))
    seq = next((sizes[a.name] for a in program.dims if a.role is Role.SEQ and a.name in sizes), 1)
    shapes = table.shapes
    parameters = flops = 0
    for key in table.keys:
        decl = program.block(key.block).decl_map[key.decl]
        assert isinstance(decl, KindDecl)
        # a tied head's weight is the embedding's tensor; buffers and counters are state, not parameters
        parameters += math.prod(key.shape) if key.role == "parameter" and key.alias_of is None else 0
        if len(key.shape) == 2 and key.family != "embedding":
            flops += 2 * tokens * math.prod(key.shape)
        out = f"{key.owner}.{layer_names(decl.kind, dict(decl.args)).get('o')}.weight"
        if key.family == "self_attention" and key.name == out:
            o = shapes[key.name]
            width = o[0] if decl.arg("conv1d") else o[1]  # heads × head_dim: the output projection's input
            flops += 4 * tokens * seq * width
    return ModelSize(parameters, flops)
