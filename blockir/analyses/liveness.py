"""Liveness: may a residual add write its result over an operand's storage?

One analysis serves the buffer plan (which a lowering follows) and the
verifier of user-asserted ``@inplace`` adds. In training every op
keeps what its backward needs (docs/verifiers.md, liveness): a norm its input and row
statistics, a branch its input, dropout a mask or seed, a learned scale its
input. In inference nothing is kept. An add may write in place over its
target operand (the shortcut of a residual add, the left operand otherwise)
only if no later op reads the target, nothing saved it for backward, the
other operand cannot share its storage, and the result has the target's
dtype. From those decisions a buffer plan assigns storage to every value.

A block's inputs are donated: the caller does not read them after the call,
so the first residual add may overwrite the block input.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from blockir.analyses.structure import decl_kind, describe, wrapper
from blockir.ir.consts import Num
from blockir.analyses.block_queries import applies_norm, has, plain_add
from blockir.ir.traits import AddNorm, Calls, Converts, Function, Product, ResidualSum, Scales, Sink, Stochastic
from blockir.ops import Op
from blockir.ir.printer import format_op
from blockir.ir.program import Block
from blockir.ir.types import DType, TensorType
from blockir.norms import FAMILIES

Mode = Literal["train", "infer"]
MODES = ("train", "infer")
OPAQUE = ("extern", "block", "stack")  # calls whose results may be views of their arguments


@dataclass(frozen=True)
class Keep:
    """What one op keeps alive for its backward."""

    op: Op
    values: tuple[str, ...]  # IR values it saves
    state: tuple[str, ...]  # compact state that is not an IR value (row statistics, a mask)
    why: str


@dataclass(frozen=True)
class AddDecision:
    op: Op
    target: str  # the operand whose storage the result would take
    inplace: bool
    blocker: Op | None = None  # the op that reads or saved the target, or made the alias
    kind: str | None = None  # read | saved | alias | dtype
    reason: str | None = None

    @property
    def result(self) -> str:
        return self.op.residual if has(self.op, AddNorm) else self.op.result


@dataclass(frozen=True)
class BufferPlan:
    block: str
    mode: str
    stream: TensorType  # the type whose live copies are counted
    buffers: tuple[tuple[str, int], ...]  # value → buffer, in definition order
    adds: tuple[AddDecision, ...]
    kept: tuple[Keep, ...]
    peak: int  # most stream-typed buffers live at once
    peak_at: str  # the value being computed when the peak is reached
    types: dict[str, TensorType] = field(default_factory=dict, compare=False, repr=False)

    def buffer_of(self, value: str) -> int:
        return dict(self.buffers)[value]

    def shared(self) -> list[tuple[int, tuple[str, ...]]]:
        """Every buffer with the values it holds over the block, in buffer order."""
        groups: dict[int, list[str]] = {}
        for v, b in self.buffers:
            groups.setdefault(b, []).append(v)
        return [(b, tuple(vs)) for b, vs in sorted(groups.items())]

    def decision(self, result: str) -> AddDecision:
        return next(d for d in self.adds if d.result == result)


def _mask(op: Op, t: TensorType) -> str:
    axes = list(t.names)
    keep = {"element": axes, "row": axes[:-1], "channel": axes[:1] + axes[-1:], "sample": axes[:1],
            "layer": []}[op.mask]
    return "[" + ", ".join(a if a in keep else "1" for a in axes) + "]"


def _zero(p: object) -> bool:
    return isinstance(p, Num) and p.value == 0


def kept(block: Block, op: Op) -> Keep | None:
    """What ``op`` saves for backward in training (None: nothing)."""
    if applies_norm(op):
        t = block.type_of(op.operand)
        rows = "[" + ", ".join([*t.names[:-1], "1"]) + "]"
        kind = decl_kind(block, op)
        stats = () if kind in FAMILIES and FAMILIES[kind].elementwise else (f"row statistics {rows}",)
        return Keep(op, (op.operand,), stats, "a norm keeps its input" + (" and row statistics" if stats else ""))
    if has(op, Calls):
        what = "an activation" if decl_kind(block, op) == "activation" else "a branch"
        return Keep(op, op.args, (), f"{what} keeps its input")
    if has(op, Function):
        return Keep(op, (op.operand,), (), "an activation keeps its input")
    if has(op, Stochastic) and not _zero(op.p):
        return Keep(op, (), (f"mask {_mask(op, op.type)} or its seed",), "dropout keeps a mask or a seed")
    if has(op, Scales) and op.param is not None:
        return Keep(op, (op.operand,), (), "a learned scale keeps its input")
    if has(op, Product):
        return Keep(op, (op.lhs, op.rhs), (), "a product keeps both factors")
    if has(op, AddNorm):
        values = (op.residual,) + ((op.branch,) if op.branch_param is not None else ())
        return Keep(op, values, ("row statistics",), "a fused add+norm keeps the residual sum and row statistics")
    return None


def _aliases(block: Block, mode: str) -> dict[str, set[str]]:
    """value → the values it may share storage with (views and no-op results)."""
    alias: dict[str, set[str]] = {}
    for op in block.ops:
        for r in op.results:
            alias[r] = {r}
        if has(op, Converts) or has(op, Stochastic) and (mode == "infer" or _zero(op.p)):
            alias[op.result] |= alias.get(op.operand, {op.operand})
        elif has(op, Calls) and decl_kind(block, op) in OPAQUE:
            for a in op.args:
                alias[op.result] |= alias.get(a, {a})
    for v, group in list(alias.items()):
        for other in group:
            alias.setdefault(other, {other}).add(v)
    return alias


def _targets(block: Block) -> dict[int, str]:
    """id(add) → the operand an in-place write would overwrite."""
    out = {id(s.root): s.shortcut for s in wrapper(block).sublayers if s.shortcut is not None}
    for op in block.ops:
        if plain_add(op):
            out.setdefault(id(op), op.lhs)
        elif has(op, AddNorm):
            out.setdefault(id(op), op.shortcut)
    return out


def _decide(block: Block, index: int, op: Op, target: str, alias: dict[str, set[str]],
            saved_by: dict[str, Op]) -> AddDecision:
    group = alias.get(target, {target})
    for later in block.ops[index + 1:]:
        read = group & set(later.operands)
        if read:
            return AddDecision(op, target, False, later, "read",
                               f"{_name(block, later)} reads {_which(block, target, read)} later")
    for v in sorted(group, key=lambda v: (v != target, v)):
        if v in saved_by:
            keep = kept(block, saved_by[v])
            why = f" ({keep.why})" if keep is not None else ""
            return AddDecision(op, target, False, saved_by[v], "saved",
                               f"{_name(block, saved_by[v])} saves {_which(block, target, {v})} for backward{why}")
    if has(op, AddNorm):
        other = op.branch
    else:
        other = op.rhs if op.lhs == target else op.lhs
    if other in group:
        producer = block.producers.get(other)
        return AddDecision(op, target, False, producer, "alias",
                           f"the other operand {describe(block, other)} may share its storage")
    have = (op.residual_type if has(op, AddNorm) else op.type).dtype
    store = block.type_of(target).dtype
    if have != store:
        return AddDecision(op, target, False, None, "dtype",
                           f"the result is {_dtype(have)}, the storage {_dtype(store)}")
    return AddDecision(op, target, True)


def _dtype(d: DType | None) -> str:
    return d.value if d is not None else "the activation dtype"


def _which(block: Block, target: str, values: set[str]) -> str:
    if target in values:
        return "it"
    return f"{describe(block, sorted(values)[0])}, which may share its storage,"


def _name(block: Block, op: Op) -> str:
    if has(op, Sink):
        return "the return"
    decl = getattr(op, "decl", None)
    return f"'{decl}'" if decl else describe(block, op.result)


def plan(block: Block, mode: Mode) -> BufferPlan:
    """The in-place decisions and buffer plan of ``block`` in ``mode`` ('train' or 'infer')."""
    if mode not in MODES:
        raise ValueError(f"mode must be 'train' or 'infer', got {mode!r}")
    keeps = tuple(k for op in block.ops if (k := kept(block, op)) is not None) if mode == "train" else ()
    saved_by: dict[str, Op] = {}
    for k in keeps:
        for v in k.values:
            saved_by.setdefault(v, k.op)
    alias = _aliases(block, mode)
    targets = _targets(block)
    decisions = [_decide(block, i, op, targets[id(op)], alias, saved_by)
                 for i, op in enumerate(block.ops) if has(op, ResidualSum)]
    buffers, peak, peak_at = _allocate(block, mode, decisions, set(saved_by))
    types = {v: block.type_of(v) for v, _ in buffers}
    return BufferPlan(block.name, mode, block.result, tuple(buffers), tuple(decisions), keeps, peak, peak_at, types)


def _allocate(block: Block, mode: str, decisions: list[AddDecision],
              saved: set[str]) -> tuple[list[tuple[str, int]], int, str]:
    """Linear scan: in-place results and inference no-ops take their operand's buffer, others reuse freed ones."""
    last: dict[str, int] = {}
    for i, op in enumerate(block.ops):
        for r in op.results:
            last[r] = i  # a value nobody reads dies where it is made
        for v in op.operands:
            last[v] = i
    end = len(block.ops)
    for v in saved:
        last[v] = end  # held for backward
    inplace = {id(d.op): d.target for d in decisions if d.inplace}
    buffer: dict[str, int] = {}
    holders: dict[int, int] = {}  # buffer → live values holding it
    free: dict[tuple, list[int]] = {}
    shape: dict[int, tuple] = {}
    order: list[tuple[str, int]] = []
    peak, peak_at, count = 0, "", 0
    stream = block.result.names

    def key(v: str) -> tuple:
        t = block.type_of(v)
        return (t.names, t.dtype)

    def take(v: str, b: int) -> None:
        buffer[v] = b
        holders[b] = holders.get(b, 0) + 1
        order.append((v, b))

    for i, op in enumerate(block.ops):
        for r in op.results:
            same = inplace.get(id(op)) if r == getattr(op, "residual", r) else None
            if same is None and has(op, Stochastic) and mode == "infer":
                same = op.operand  # dropout is the identity in inference
            if same is not None:
                take(r, buffer[same])
                continue
            pool = free.get(key(r), [])
            if pool:
                take(r, pool.pop(0))
            else:
                shape[count] = key(r)
                take(r, count)
                count += 1
        live = {buffer[v] for v in buffer if last[v] >= i} | {buffer[r] for r in op.results}
        width = sum(shape[b][0] == stream for b in live)
        if width > peak:
            peak, peak_at = width, ", ".join(op.results) or "the return"
        for v in [*op.operands, *op.results]:
            if v in buffer and 0 <= last[v] <= i and v not in saved and not has(op, Sink):
                b = buffer[v]
                holders[b] -= 1
                last[v] = -1  # released once
                if holders[b] == 0:
                    free.setdefault(shape[b], []).append(b)
    return order, peak, peak_at


def format_plan(block: Block, p: BufferPlan) -> str:
    """The plan as text: adds and their decisions, shared buffers, peak live stream tensors."""
    lines = [f"{block.kind} {block.name} (mode {p.mode})", "  residual adds:"]
    for d in p.adds:
        text = format_op(d.op)
        if d.inplace:
            lines.append(f"    {text:<34} in place: writes over '{d.target}'")
        else:
            where = f", at {d.blocker.span}" if d.blocker is not None else ""
            lines.append(f"    {text:<34} out of place: '{d.target}' stays: {d.reason}{where}")
    if not p.adds:
        lines.append("    (none)")
    if p.kept:
        lines.append("  kept for backward:")
        for k in p.kept:
            items = [f"'{v}'" for v in k.values] + list(k.state)
            lines.append(f"    {format_op(k.op):<34} {', '.join(items)}")
    lines.append("  buffers:")
    for b, values in p.shared():
        lines.append(f"    b{b} {str(p.types[values[0]]):<16} {', '.join(values)}")
    lines.append(f"  peak live {p.stream} tensors: {p.peak} (while computing {p.peak_at})")
    return "\n".join(lines)
