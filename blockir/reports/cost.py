"""The residual-update ledger (docs/cost.md): what the wrapper of a block costs.

For one block or model at concrete sizes it counts residual elements, residual
adds, norm parameters, row reductions, bytes moved through memory by the
wrapper ops (unfused, and after :func:`blockir.passes.fuse.fuse_program`) and
bytes saved for backward in training. Stacks multiply, sub-blocks add.

The wrapper ops are the adds, scales, dropouts, casts and norms that are not
inside a branch; branch internals (attention, MLP, projections, activations)
are out of scope. Every op reads each operand once and writes each result
once at its dtype (a "perfect kernel"); a fused add+norm boundary is counted
by :class:`FusedBoundary`, the same count ``benchmarks/fused_norm.py`` uses.
The counts are for the training forward: dropout is active where p > 0, norms
write their row statistics, and the saved bytes are what backward keeps.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping

from blockir.norms import FAMILIES, family
from blockir.analyses.sizes import Env, Sizes, block_env, program_env, reads_layer, uses_layer, value
from blockir.analyses.shortcut_weights import StackWeights, describe, route_summary, stack_weights
from blockir.analyses.structure import interpolation, wrapper
from blockir.ir import consts as C
from blockir import ops as O
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.types import DType, TensorType
from blockir.reports.model_size import ModelSize, model_size
from blockir.passes.fuse import fuse_program
from blockir.passes.inline import inline_stacks

MIB = 1 << 20
STATS_ITEMSIZE = 4  # row statistics are fp32 unless a norm declares another accumulation dtype

# row reductions per norm application: (forward, backward). LayerNorm reduces the mean and the
# variance forward and sum(g*w) and sum(g*w*xhat) backward; RMSNorm and ScaleNorm one square sum
# forward and sum(g*w*xhat) backward; DyT is elementwise. Row statistics saved for backward: mean and
# rstd, rstd, the row norm, none. Both come from the norm-family table.
REDUCTIONS = {name: f.reductions for name, f in FAMILIES.items()}
STATS = {name: f.statistics for name, f in FAMILIES.items()}

SCOPE = ("branch internals (attention, MLP, projections, activations) are not counted: only the residual "
         "wrapper (adds, scales, dropouts, casts, norms)")


class CostError(Exception):
    """The ledger cannot be computed at these sizes (a dim without a size, an unknown block)."""


@dataclass(frozen=True)
class FusedBoundary:
    """One fused add+norm call as a perfect kernel sees it: each operand read once, each result written once.

    ``itemsize`` is the branch's (and of a learned branch scale); the residual, its norm's parameters
    and residual_out use ``residual_itemsize``; ``normalized`` uses ``output_itemsize``.
    """

    family: str  # layernorm | rmsnorm
    rows: int
    width: int
    itemsize: int
    residual_itemsize: int
    output_itemsize: int
    weight: bool = True
    bias: bool = False
    scale_elements: int = 0  # a learned branch scale: 1 (ReZero) or width (LayerScale)

    @property
    def stats_bytes(self) -> int:
        return STATS[self.family] * self.rows * STATS_ITEMSIZE

    @property
    def branch_bytes(self) -> int:
        return self.rows * self.width * self.itemsize

    @property
    def residual_bytes(self) -> int:
        return self.rows * self.width * self.residual_itemsize

    @property
    def output_bytes(self) -> int:
        return self.rows * self.width * self.output_itemsize

    @property
    def param_bytes(self) -> int:
        return (self.weight + self.bias) * self.width * self.residual_itemsize

    @property
    def scale_bytes(self) -> int:
        return self.scale_elements * self.itemsize

    def forward_bytes(self) -> int:
        """Reads branch, residual and parameters; writes normalized, residual_out and the row statistics."""
        reads = self.branch_bytes + self.residual_bytes + self.param_bytes + self.scale_bytes
        return reads + self.output_bytes + self.residual_bytes + self.stats_bytes

    def backward_bytes(self) -> int:
        """Reads both output gradients, residual_out, the statistics and the weight (and, with a learned
        scale, the saved branch and the scale); writes d_branch, d_residual and the parameter gradients."""
        reads = self.output_bytes + 2 * self.residual_bytes + self.stats_bytes
        reads += self.weight * self.width * self.residual_itemsize
        if self.scale_elements:
            reads += self.branch_bytes + self.scale_bytes
        return reads + self.branch_bytes + self.residual_bytes + self.param_bytes + self.scale_bytes

    def saved_bytes(self) -> int:
        """residual_out and the fp32 statistics, plus the branch when a learned scale needs its gradient."""
        return self.residual_bytes + self.stats_bytes + (self.branch_bytes if self.scale_elements else 0)


def fused_boundary_bytes(family: str, rows: int, width: int, itemsize: int, backward: bool = False) -> int:
    """Bytes one fused boundary moves with every tensor in one dtype and the family's affine parameters
    (weight and bias for LayerNorm, weight for RMSNorm); forward, or forward plus backward."""
    b = FusedBoundary(family, rows, width, itemsize, itemsize, itemsize, bias=FAMILIES[family].fused_code == "layer")
    return b.forward_bytes() + (b.backward_bytes() if backward else 0)


@dataclass(frozen=True)
class Tally:
    """The additive quantities of one graph: they sum over sub-blocks and multiply over stacks."""

    adds: int = 0
    norm_params: Mapping[str, int] = field(default_factory=dict)  # by norm family
    reductions_forward: int = 0  # row reductions over all rows
    reductions_backward: int = 0
    bytes_moved: int = 0
    saved_bytes: int = 0

    def __add__(self, other: Tally) -> Tally:
        params = dict(self.norm_params)
        for family, n in other.norm_params.items():
            params[family] = params.get(family, 0) + n
        return Tally(self.adds + other.adds, params, self.reductions_forward + other.reductions_forward,
                     self.reductions_backward + other.reductions_backward, self.bytes_moved + other.bytes_moved,
                     self.saved_bytes + other.saved_bytes)

    def __sub__(self, other: Tally) -> Tally:
        return self + other * -1

    def __mul__(self, n: int) -> Tally:
        """``n`` instances of this graph (a stack of n identical layers)."""
        return Tally(self.adds * n, {k: v * n for k, v in self.norm_params.items()}, self.reductions_forward * n,
                     self.reductions_backward * n, self.bytes_moved * n, self.saved_bytes * n)

    @property
    def norm_parameters(self) -> int:
        return sum(self.norm_params.values())


@dataclass(frozen=True)
class BlockCost:
    """One block: its state, one instance's tallies (unfused and fused graph) and how often it occurs."""

    name: str
    instances: int
    state: str  # the state's type, e.g. "[B, S, D] bf16"
    residual_elements: int
    residual_itemsize: int
    rows: int
    unfused: Tally
    fused: Tally
    carried_bytes: int = 0  # the carried streams one instance returns beside its state (scores: [B, H, S, S])

    @property
    def bytes_per_tensor(self) -> int:
        return self.residual_elements * self.residual_itemsize


@dataclass(frozen=True)
class Ledger:
    filename: str
    root: str
    dims: Mapping[str, int]  # the sizes of the root's state axes
    dtype: DType
    blocks: tuple[BlockCost, ...]  # every block reached, innermost first; the root (the whole model) last
    size: ModelSize | None = None  # parameters and forward matmul FLOPs of the whole root
    depth: tuple[StackWeights, ...] = ()  # the cumulative shortcut weights of the root's stacks

    @property
    def total(self) -> BlockCost:
        return self.blocks[-1]


@dataclass
class _Walk:
    """One pass over a program: the default dtype, and the first instance and count of every block seen."""

    program: Program
    base: Env
    dtype: DType
    first: dict[str, Tally] = field(default_factory=dict)
    instances: dict[str, int] = field(default_factory=dict)


def _size(name: str, env: Env) -> int:
    if name not in env:
        raise CostError(f"dim '{name}' has no size; give it, e.g. --dims {name}=…")
    return int(env[name])


def _elements(t: TensorType, env: Env) -> int:
    n = 1
    for axis in t.axes:
        n *= _size(axis.name, env)
    return n


def _itemsize(t: TensorType, default: DType) -> int:
    return (t.dtype or default).itemsize


def _nbytes(t: TensorType, env: Env, default: DType) -> int:
    return _elements(t, env) * _itemsize(t, default)


def _rows(t: TensorType, env: Env) -> int:
    return _elements(t, env) // _size(t.axes[-1].name, env) if t.axes else 1


def norm_parameters(decl: KindDecl, env: Env) -> int:
    """Parameter elements of one norm declaration: LayerNorm 2D (D without bias, 0 without affine),
    RMSNorm D, ScaleNorm 1, DyT 2D + 1."""
    return family(decl).parameters(decl, _size(decl.arg("axes")[-1], env))


def _stats_itemsize(decl: KindDecl) -> int:
    accum = decl.arg("accum")
    return DType(accum).itemsize if accum else STATS_ITEMSIZE


def _internal(block: Block) -> set[int]:
    """Ops inside a branch's computation: everything between its pre-norms and its output modifiers."""
    out: set[int] = set()
    for sub in wrapper(block).sublayers:
        step = interpolation(block, sub)  # nGPT's t - x belongs to the update, like a scale does
        for b in sub.branches:
            edge = {id(op) for op in (*b.modifiers, *b.pre_norms, b.out_norm, step) if op is not None}
            out |= {id(op) for op in b.ops} - edge
    return out


def _boundary(block: Block, op: O.FusedAddNormOp, env: Env, dtype: DType) -> FusedBoundary:
    decl = block.decl_map[op.decl]
    branch, residual = block.type_of(op.branch), op.residual_type
    scale = 0
    if op.branch_param is not None:
        gain = block.decl_map[op.branch_param]
        scale = 1 if gain.kind == "scalar" else _size(gain.arg("axis"), env)
    fam = family(decl)
    return FusedBoundary(decl.kind, _rows(residual, env), _size(residual.axes[-1].name, env),
                         _itemsize(branch, dtype), _itemsize(residual, dtype), _itemsize(op.type, dtype),
                         weight=fam.weight(decl), bias=fam.bias(decl),
                         scale_elements=scale)


@dataclass
class _Own:
    """The tallies of a block's own wrapper ops, built op by op."""

    bytes_moved: int = 0
    saved: dict[str, int] = field(default_factory=dict)  # value -> bytes: a value saved twice is kept once
    stats: int = 0
    forward: int = 0
    backward: int = 0

    def reductions(self, family: str, rows: int) -> None:
        f, b = REDUCTIONS[family]
        self.forward += f * rows
        self.backward += b * rows


def _norm(block: Block, op: O.NormOp, env: Env, dtype: DType, own: _Own) -> None:
    decl = block.decl_map[op.decl]
    assert isinstance(decl, KindDecl)
    t_in = block.type_of(op.operand)
    rows = _rows(t_in, env)
    stats = STATS[decl.kind] * rows * _stats_itemsize(decl)
    params = norm_parameters(decl, env) * _itemsize(t_in, dtype)
    own.bytes_moved += _nbytes(t_in, env, dtype) + params + _nbytes(op.type, env, dtype) + stats
    own.saved[op.operand] = _nbytes(t_in, env, dtype)
    own.stats += stats
    own.reductions(decl.kind, rows)


def _wrapper_op(block: Block, op: O.Op, env: Env, dtype: DType, own: _Own) -> None:
    """Add one wrapper op's bytes moved and bytes saved for backward to ``own``."""
    def nb(v: str) -> int:
        return _nbytes(block.type_of(v), env, dtype)

    if isinstance(op, (O.AddOp, O.SubOp)):
        own.bytes_moved += nb(op.lhs) + nb(op.rhs) + nb(op.result)
    elif isinstance(op, O.CastOp):
        own.bytes_moved += nb(op.operand) + nb(op.result)
    elif isinstance(op, O.DropoutOp):
        if value(op.p, env) != 0:  # p = 0 lowers to nothing; an active mask is regenerated, never stored
            own.bytes_moved += nb(op.operand) + nb(op.result)
    elif isinstance(op, O.ScaleOp):
        own.bytes_moved += nb(op.operand) + nb(op.result)
        if op.param is not None:  # a learned gain reads itself and keeps its input for its own gradient
            gain = block.decl_map[op.param]
            elements = 1 if gain.kind == "scalar" else _size(gain.arg("axis"), env)
            own.bytes_moved += elements * _itemsize(block.type_of(op.operand), dtype)
            own.saved[op.operand] = nb(op.operand)
    elif isinstance(op, O.BiasOp):  # its gradient is the sum of the incoming one: nothing saved
        own.bytes_moved += nb(op.operand) + nb(op.result) + _size(block.decl_map[op.param].arg("axis"), env) \
            * _itemsize(block.type_of(op.operand), dtype)
    elif isinstance(op, O.ComplementOp):
        own.bytes_moved += nb(op.operand) + nb(op.result)
    elif isinstance(op, O.MulOp):  # each factor's gradient needs the other
        own.bytes_moved += nb(op.lhs) + nb(op.rhs) + nb(op.result)
        own.saved[op.lhs] = nb(op.lhs)
        own.saved[op.rhs] = nb(op.rhs)
    elif isinstance(op, O.NormOp):
        _norm(block, op, env, dtype, own)
    elif isinstance(op, O.FusedAddNormOp):
        b = _boundary(block, op, env, dtype)
        own.bytes_moved += b.forward_bytes()
        own.saved[op.residual] = b.residual_bytes
        if b.scale_elements:  # saved_bytes(), with each value keyed so that a value saved twice counts once
            own.saved[op.branch] = b.branch_bytes
        own.stats += b.stats_bytes
        own.reductions(b.family, b.rows)


WRAPPER_OPS = (O.AddOp, O.SubOp, O.CastOp, O.DropoutOp, O.ScaleOp, O.BiasOp, O.ComplementOp, O.MulOp, O.NormOp,
               O.FusedAddNormOp)


def _own_tally(block: Block, env: Env, dtype: DType) -> Tally:
    internal = _internal(block)
    own = _Own()
    for op in block.ops:
        if isinstance(op, WRAPPER_OPS) and id(op) not in internal:
            _wrapper_op(block, op, env, dtype, own)
    adds = sum(1 if isinstance(s.root, O.FusedAddNormOp) else len(s.adds) for s in wrapper(block).sublayers)
    params: dict[str, int] = {}
    for d in block.decls:
        if isinstance(d, KindDecl) and d.category == "norm":
            params[d.kind] = params.get(d.kind, 0) + norm_parameters(d, env)
    return Tally(adds, params, own.forward, own.backward, own.bytes_moved, sum(own.saved.values()) + own.stats)


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
    total = _own_tally(block, env, walk.dtype)
    for op in block.ops:
        decl = block.decl_map.get(getattr(op, "decl", "") or "")
        if not isinstance(op, O.CallOp) or not isinstance(decl, InstanceDecl):
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
                                _elements(state, base), _itemsize(state, dtype), _rows(state, base),
                                plain.first[block_name], fused.first[block_name],
                                sum(_nbytes(t, base, dtype) for t in block.more_results)))
    root_state = _state(program.block(name))
    sizes = {a.name: _size(a.name, base) for a in root_state.axes}
    return Ledger(program.filename, name, sizes, dtype, tuple(blocks),
                  model_size(program, name, {a.name: base[a.name] for a in program.dims if a.name in base}),
                  stack_weights(program, program.block(name), base))


# --- output ----------------------------------------------------------------------------------------

def _mib(n: int) -> str:
    return f"{n / MIB:,.2f} MiB"


def _per_row(n: int, rows: int) -> str:
    return f"{n / rows:g}" if rows else "0"


def _rows_of(b: BlockCost, carried: bool = False) -> list[tuple[str, str]]:
    u, f = b.unfused, b.fused
    params = ", ".join(f"{k} {v:,}" for k, v in sorted(u.norm_params.items())) or "none"
    return [
        ("instances", f"{b.instances:,}"),
        ("residual elements", f"{b.residual_elements:,}"),
        ("bytes per residual tensor", _mib(b.bytes_per_tensor)),
        *([("bytes of carried streams", _mib(b.carried_bytes))] if carried else []),
        ("residual adds", f"{u.adds:,}"),
        ("norm parameters", f"{u.norm_parameters:,}"),
        ("  by family", params),
        ("row reductions fwd / bwd", f"{u.reductions_forward:,} / {u.reductions_backward:,}"),
        ("  per state row", f"{_per_row(u.reductions_forward, b.rows)} / {_per_row(u.reductions_backward, b.rows)}"),
        ("bytes moved, unfused", _mib(u.bytes_moved)),
        ("bytes moved, fused", _mib(f.bytes_moved)),
        ("saved for backward, unfused", _mib(u.saved_bytes)),
        ("saved for backward, fused", _mib(f.saved_bytes)),
    ]


def format_ledger(led: Ledger) -> str:
    """A table: one column per block (one instance; the root column is the whole model)."""
    sizes = ", ".join(f"{k}={v:,}" for k, v in led.dims.items())
    head = [f"cost of {led.root} in {led.filename} ({sizes}; {led.dtype.value} where a type leaves the dtype open; "
            "training forward)"]
    carried = any(b.carried_bytes for b in led.blocks)
    columns = [[label for label, _ in _rows_of(led.total, carried)]]
    titles = [""]
    for b in led.blocks:
        columns.append([v for _, v in _rows_of(b, carried)])
        titles.append(b.name + (" (whole)" if b is led.total and len(led.blocks) > 1 else ""))
    widths = [max(len(t), *(len(v) for v in col)) for t, col in zip(titles, columns)]
    lines = ["  ".join(t.ljust(w) if i == 0 else t.rjust(w) for i, (t, w) in enumerate(zip(titles, widths)))]
    for r in range(len(columns[0])):
        lines.append("  ".join(col[r].ljust(w) if i == 0 else col[r].rjust(w)
                               for i, (col, w) in enumerate(zip(columns, widths))))
    notes = ("each column is one instance of a block with its sub-blocks; stacks multiply, sub-blocks add. "
             "bytes: each wrapper op reads every operand once and writes every result once at its dtype; a norm "
             "also writes its row statistics; fused: after the add+norm fusion pass, each boundary one kernel. "
             "saved: what backward keeps (a norm's input and row statistics, a learned scale's input, a fused "
             "op's residual_out and statistics, plus its branch under a learned scale); dropout keeps no mask; "
             f"parameters are not counted. {SCOPE[0].upper()}{SCOPE[1:]}.")
    lines += [""] * bool(led.depth) + [describe(s) for s in led.depth]
    if led.size is not None:
        lines += ["", f"parameters {led.size.parameters:,}; forward matmul FLOPs {led.size.matmul_flops:,} "
                  "(2 × tokens × each projection matrix, plus 4 × B × S² × heads × head_dim per self-attention)"]
    return "\n".join(head + [""] + lines + [""] + textwrap.wrap(notes, 100)) + "\n"


def _tally_data(t: Tally) -> dict[str, Any]:
    return {"residual_adds": t.adds, "norm_parameters": t.norm_parameters, "norm_parameters_by_family":
            dict(sorted(t.norm_params.items())), "row_reductions": {"forward": t.reductions_forward,
                                                                    "backward": t.reductions_backward}}


def ledger_data(led: Ledger) -> dict[str, Any]:
    """The ledger as JSON-ready data: bytes are exact integers."""
    def block(b: BlockCost) -> dict[str, Any]:
        return {"name": b.name, "instances": b.instances, "state": b.state, "rows": b.rows,
                "residual_elements": b.residual_elements, "bytes_per_tensor": b.bytes_per_tensor,
                **({"carried_bytes": b.carried_bytes} if b.carried_bytes else {}),
                **_tally_data(b.unfused),
                "bytes_moved": {"unfused": b.unfused.bytes_moved, "fused": b.fused.bytes_moved},
                "saved_bytes": {"unfused": b.unfused.saved_bytes, "fused": b.fused.saved_bytes}}
    return {"file": led.filename, "block": led.root, "dims": dict(led.dims), "dtype": led.dtype.value,
            "mode": "train", "scope": SCOPE, "blocks": [block(b) for b in led.blocks], "total": block(led.total),
            **({"parameters": led.size.parameters, "matmul_flops_forward": led.size.matmul_flops}
               if led.size is not None else {}),
            "shortcut_weights": [{**s.data(), "summary": route_summary(s)} for s in led.depth]}
