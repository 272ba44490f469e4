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

from blockir.analyses.keys import Key, key_table, param_keys
from blockir.analyses.sizes import Sizes, uses_layer
from blockir.ir import consts as C
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.kinds import layer_names
from blockir.ir.program import Block, Program
from blockir.ir.types import Role


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    matmul_flops: int  # forward


def model_size(program: Program, name: str, sizes: Mapping[str, int]) -> ModelSize:
    """Counts for block or model ``name``; ``sizes`` holds the batch and sequence sizes (and any open dim).

    A stack of a layer whose declarations do not read the layer index counts one layer times its
    count, so the cost of the count does not grow with depth; otherwise every key is counted."""
    tokens = math.prod(sizes.get(a.name, 1) for a in program.dims if a.role in (Role.BATCH, Role.SEQ))
    seq = next((sizes[a.name] for a in program.dims if a.role is Role.SEQ and a.name in sizes), 1)
    if name not in program.block_map or any(_shapes_read_layer(b) for b in program.blocks):
        table = param_keys(program, name, dict(sizes))  # for an unknown name, its located error
        return ModelSize(*_tally(program, table.keys, table.shapes, tokens, seq))
    base = Sizes.of(program, dict(sizes))
    memo: dict[str, tuple[int, int]] = {}

    def count(block: Block) -> tuple[int, int]:
        if block.name not in memo:
            own = key_table(program, block, base, nested=False)
            parameters, flops = _tally(program, own.keys, own.shapes, tokens, seq)
            scope = base.for_block(block)
            for d in block.decls:
                if isinstance(d, InstanceDecl) and d.block in program.block_map:
                    n = 1 if d.count is None else scope.count(d.count, f"the layer count of '{d.name}'", d.span)
                    p, f = count(program.block(d.block))
                    parameters, flops = parameters + n * p, flops + n * f
            memo[block.name] = (parameters, flops)
        return memo[block.name]

    return ModelSize(*count(program.block(name)))


def _shapes_read_layer(block: Block) -> bool:
    """Whether a declaration's argument or a layer count reads the layer index (op constants such as a
    drop probability may: they do not change a key's shape)."""
    exprs = [v for d in block.decls if isinstance(d, KindDecl) for _, v in d.args]
    exprs += [d.count for d in block.decls if isinstance(d, InstanceDecl)]
    return any(isinstance(e, C.EXPRS) and uses_layer(e, block) for e in exprs)


def _tally(program: Program, keys: tuple[Key, ...], shapes: Mapping[str, tuple[int, ...]], tokens: int,
           seq: int) -> tuple[int, int]:
    parameters = flops = 0
    for key in keys:
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
    return parameters, flops
