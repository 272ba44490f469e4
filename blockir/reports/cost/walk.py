"""The residual-update ledger of a block or model (docs/cost.md): one walk over its blocks.

For one block or model at concrete sizes it counts residual elements, residual adds, norm
parameters, row reductions, bytes moved through memory by the wrapper ops (unfused, and after
:func:`blockir.passes.fuse.fuse_program`) and bytes saved for backward in training. Stacks multiply,
sub-blocks add; a stack whose layers are alike is counted once per distinct layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from blockir.analyses.sizes import Env, Sizes, block_env, program_env, reads_layer, uses_layer, value
from blockir.analyses.shortcut_weights import stack_weights
from blockir.ir import consts as C
from blockir.ir.decls import InstanceDecl
from blockir.ir.program import Block, Program
from blockir.ir.traits import Calls
from blockir.ir.types import DType, TensorType
from blockir.passes.fuse import fuse_program
from blockir.passes.inline import inline_stacks
from blockir.reports.cost.counts import BlockCost, CostError, Ledger, Tally, elements, itemsize, nbytes, rows, size
from blockir.reports.cost.wrapper import own_tally
from blockir.reports.model_size import model_size


@dataclass
class _Walk:
    """One pass over a program: the default dtype, and the first instance and count of every block seen."""

    program: Program
    base: Env
    dtype: DType
    first: dict[str, Tally] = field(default_factory=dict)
    instances: dict[str, int] = field(default_factory=dict)


def _layer_reads(block: Block) -> tuple[tuple[str, C.ConstExpr], ...]:
    """What a layer's tally reads from expressions that depend on the layer index: whether a dropout is
    active, and the depth of the stacks it holds. Everything else a tally reads is a size."""
    reads: list[tuple[str, C.ConstExpr]] = [("active", op.p) for op in block.ops
                                            if getattr(op, "p", None) is not None]
    reads += [("count", d.count) for d in block.decls if isinstance(d, InstanceDecl) and d.count is not None]
    return tuple((what, e) for what, e in reads if uses_layer(e, block))


def _layer_groups(walk: _Walk, sub: Block, n: int) -> list[tuple[int, int]]:
    """(first layer, layers) for each run of layers of a stack of ``n`` whose tallies are equal: one
    group for a layer that does not read its index, so the cost of a stack does not grow with ``n``."""
    reads = _layer_reads(sub)
    if not reads:
        return [(0, n)]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for layer in range(n):
        env = block_env(walk.base, sub, layer, n)
        key = tuple(value(e, env) != 0 if what == "active" else value(e, env) for what, e in reads)
        groups.setdefault(key, [layer, 0])[1] += 1
    return [(first, count) for first, count in groups.values()]


def _tally(walk: _Walk, block: Block, env: Env, weight: int) -> Tally:
    """One instance of ``block`` (own ops plus every instance of its sub-blocks); ``weight`` counts the
    instances of this very instance in the whole model."""
    total = own_tally(block, env, walk.dtype)
    for op in block.ops:
        decl = block.decl_map.get(getattr(op, "decl", "") or "")
        if not op.has(Calls) or not isinstance(decl, InstanceDecl):
            continue
        sub = walk.program.block(decl.block)
        n = 1 if decl.count is None else value(decl.count, env)
        if n is None:
            raise CostError(f"the layer count of '{decl.name}' in '{block.name}' does not evaluate")
        # layers whose environments give equal tallies are counted once and multiplied
        for first, count in _layer_groups(walk, sub, int(n)):
            total += _tally(walk, sub, block_env(walk.base, sub, first, int(n)), weight * count) * count
    walk.first.setdefault(block.name, total)
    walk.instances[block.name] = walk.instances.get(block.name, 0) + weight
    return total


def _walk(program: Program, root: Block, base: Env, dtype: DType) -> _Walk:
    walk = _Walk(program, base, dtype)
    _tally(walk, root, block_env(base, root), 1)
    return walk


def _inlined_walk(program: Program, name: str, base: Env, dtype: DType, layers: Mapping[str, int]) -> Tally:
    inlined, _ = fuse_program(inline_stacks(program, name, Sizes(base, program.filename), layers)[0])
    return _walk(inlined, inlined.block(name), base, dtype).first[name]


def _inlined_tally(program: Program, name: str, base: Env, dtype: DType) -> Tally:
    """The root's fused tally with its stacks inlined, without writing out every layer.

    Fusion only joins neighbouring ops, so each further layer of a stack whose layers are alike adds
    the same tally (its own ops and one boundary with the layer before): with one, two and three
    layers written out, T(n) = T(1) + (n - 1) (T(2) - T(1)), checked against T(3). A layer that reads
    its index may differ from its neighbours and is written out in full.
    """
    root = program.block(name)
    env = block_env(base, root)
    depths = {d.name: value(d.count, env) for d in root.decls if isinstance(d, InstanceDecl) and d.count is not None}
    alike = {k: int(n) for k, n in depths.items() if n is not None and n > 3
             and not reads_layer(program.block(root.decl_map[k].block))}  # type: ignore[union-attr]
    if not alike:
        return _inlined_walk(program, name, base, dtype, {})
    ones = dict.fromkeys(alike, 1)
    total = one = _inlined_walk(program, name, base, dtype, ones)
    for stack, n in alike.items():
        two = _inlined_walk(program, name, base, dtype, ones | {stack: 2})
        three = _inlined_walk(program, name, base, dtype, ones | {stack: 3})
        if three - two != two - one:
            return _inlined_walk(program, name, base, dtype, {})
        total += (two - one) * (n - 1)
    return total


def _state(block: Block) -> TensorType:
    inputs = block.inputs
    match = [op.type for op in inputs if op.type.names == block.result.names]
    return (match or [inputs[0].type if inputs else block.result])[0]


def instances(program: Program, name: str, dims: Mapping[str, int] | None = None) -> dict[str, int]:
    """How often each block under ``name`` is instanced (``name`` itself once): the ledger's first walk, without
    the key table, fusion or extrapolation, so a depth limit can be checked before any of them."""
    if name not in program.block_map:
        raise CostError(f"no block named '{name}' (blocks: {', '.join(program.block_map) or 'none'})")
    return dict(_walk(program, program.block(name), program_env(program, dims), DType.F32).instances)


def ledger(program: Program, name: str, dims: Mapping[str, int] | None = None,
           dtype: DType = DType.BF16) -> Ledger:
    """The ledger of block or model ``name`` at sizes ``dims`` (declared sizes fill the rest);
    ``dtype`` is the dtype of every value whose type leaves it open."""
    if name not in program.block_map:
        raise CostError(f"no block named '{name}' (blocks: {', '.join(program.block_map) or 'none'})")
    base = program_env(program, dims)  # validates the overrides
    fused_program, _ = fuse_program(program)
    plain = _walk(program, program.block(name), base, dtype)
    fused = _walk(fused_program, fused_program.block(name), base, dtype)
    # the whole graph as backend="fused" compiles it: dropout-free stacks are inlined, so a boundary
    # between layers (and into the final norm) fuses too
    fused.first[name] = _inlined_tally(program, name, base, dtype)
    blocks = []
    for block_name in plain.first:  # the order instances finish in: innermost first, the root last
        block = program.block(block_name)
        state = _state(block)
        blocks.append(BlockCost(block_name, plain.instances[block_name], str(state.with_dtype(state.dtype or dtype)),
                                elements(state, base), itemsize(state, dtype), rows(state, base),
                                plain.first[block_name], fused.first[block_name],
                                sum(nbytes(t, base, dtype) for t in block.more_results)))
    root_state = _state(program.block(name))
    sizes = {a.name: size(a.name, base) for a in root_state.axes}
    return Ledger(program.filename, name, sizes, dtype, tuple(blocks),
                  model_size(program, name, {a.name: base[a.name] for a in program.dims if a.name in base}),
                  stack_weights(program, program.block(name), base))
