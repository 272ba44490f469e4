"""Compare two blocks as graphs: identical, or where they first differ and whether the keys agree.

Each block becomes a DiGraph of ops labelled by what they compute (the op
kind and the full declaration it applies, constants expanded) with edges
labelled by operand position; networkx isomorphism decides equality, so SSA
names and the order of independent lines do not matter. When the graphs
differ, every op is given a structural hash (its label and the hashes of its
operands), and the first op on each side whose hash the other side lacks is
the first difference. Two blocks with the same parameter keys and shapes but
different graphs are the checkpoint trap: same tensors,
different function.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import networkx as nx
from networkx.algorithms.isomorphism import categorical_edge_match, categorical_node_match

from blockir.analyses.keys import key_layout, param_keys
from blockir.diagnostics import BlockError
from blockir.ir import consts as C
from blockir.ir import ops as O
from blockir.ir.printer import format_decl, format_op
from blockir.ir.program import Block, Program

NODE = categorical_node_match("label", None)
EDGE = categorical_edge_match("index", None)


def _expand(expr: C.ConstExpr, local: dict[str, C.ConstExpr]) -> C.ConstExpr:
    """Substitute block constants so `alpha * x` and `(2 * num_layers) ** 0.25 * x` compare equal."""
    if isinstance(expr, C.Name) and expr.name in local:
        return _expand(local[expr.name], local)
    if isinstance(expr, C.Bin):
        return C.Bin(expr.op, _expand(expr.left, local), _expand(expr.right, local))
    if isinstance(expr, C.Neg):
        return C.Neg(_expand(expr.operand, local))
    return expr


def _decl(block: Block, name: str | None) -> str:
    decl = block.decl_map.get(name or "")
    return format_decl(decl) if decl is not None else str(name)


def _text(e: C.ConstExpr | None, block: Block) -> str | None:
    return C.format_expr(_expand(e, {c.name: c.value for c in block.consts})) if e is not None else None


DeclText = Callable[[Block, "str | None"], str]


def label(block: Block, op: O.Op, decl: DeclText = _decl) -> tuple:
    """What ``op`` computes, independent of value names; ``decl`` says how a declaration it applies is written
    (by default with its name: a renamed declaration is a different op)."""
    if isinstance(op, O.InputOp):
        return ("input", [p.name for p in block.params].index(op.result), str(op.type))
    if isinstance(op, (O.NormOp, O.CallOp)):
        return (type(op).__name__, decl(block, op.decl), str(op.type))
    if isinstance(op, O.ActivationOp):
        return ("activation", op.fn)
    if isinstance(op, O.DropoutOp):
        return ("dropout", _text(op.p, block), op.mask)
    if isinstance(op, O.ScaleOp):
        return ("scale", _text(op.factor, block), decl(block, op.param) if op.param else None)
    if isinstance(op, O.BiasOp):
        return ("bias", decl(block, op.param))
    if isinstance(op, O.AddOp):
        return ("add", op.inplace)
    if isinstance(op, O.CastOp):
        return ("cast", op.dtype.value)
    if isinstance(op, O.FusedAddNormOp):
        return ("fused_add_norm", decl(block, op.decl), _text(op.p, block), op.mask, _text(op.branch_factor, block),
                decl(block, op.branch_param) if op.branch_param else None, _text(op.shortcut_factor, block))
    return (type(op).__name__,)


def op_graph(block: Block) -> nx.DiGraph:
    g = nx.DiGraph()
    where: dict[str, int] = {}
    for i, op in enumerate(block.ops):
        g.add_node(i, label=label(block, op))
        for r in op.results:
            where[r] = i
        for k, v in enumerate(op.operands):
            # a fused op's second result is told apart by the operand index of its reader
            g.add_edge(where[v], i, index=(k, v == getattr(block.producers[v], "residual", None)))
    return g


def op_hashes(block: Block, decl: DeclText = _decl) -> list[int]:
    """A structural hash per op: its label and the hashes of its operands (value names play no part)."""
    h: dict[str, int] = {}
    out = []
    for op in block.ops:
        value = hash((label(block, op, decl), tuple(h[v] for v in op.operands)))
        for i, r in enumerate(op.results):
            h[r] = hash((value, i))
        out.append(value)
    return out


def _first_unmatched(block: Block, mine: list[int], theirs: list[int]) -> O.Op | None:
    pool = Counter(theirs)
    for op, h in zip(block.ops, mine):
        if pool[h] > 0:
            pool[h] -= 1
        elif not isinstance(op, O.InputOp):
            return op
    return None


@dataclass(frozen=True)
class BlockDiff:
    a: Block
    b: Block
    identical: bool
    first_a: O.Op | None  # the first op of a with no counterpart in b
    first_b: O.Op | None
    same_keys: bool | None  # None when the keys could not be sized
    key_changes: tuple[str, ...]  # "+key [shape]" / "-key [shape]"
    signature_changed: bool

    @property
    def verdict(self) -> str:
        if self.identical:
            return "identical"
        if self.same_keys:
            return "same parameter keys and shapes, different function"
        if self.same_keys is None:
            return "different function (parameter keys not compared: some dims have no size)"
        return "different function and different parameter keys"


def _keys(program: Program, block: Block) -> dict[str, tuple] | None:
    try:
        table = param_keys(program, block.name)
    except BlockError:  # a dim without a size: keys are not compared
        return None
    return table.shapes | {f"{p}.*": ("extern",) for p in table.unknown}


def _layout(program: Program, block: Block) -> tuple | None:
    try:
        return key_layout(program, block.name)
    except BlockError:  # a dim without a size: keys are not compared
        return None


def diff_blocks(pa: Program, a: Block, pb: Program, b: Block) -> BlockDiff:
    ga, gb = op_graph(a), op_graph(b)
    signature_changed = [str(p.type) for p in a.params] != [str(p.type) for p in b.params] \
        or str(a.result) != str(b.result)
    identical = not signature_changed and nx.is_isomorphic(ga, gb, node_match=NODE, edge_match=EDGE)
    ha, hb = op_hashes(a), op_hashes(b)
    first_a = None if identical else _first_unmatched(a, ha, hb)
    first_b = None if identical else _first_unmatched(b, hb, ha)
    if _layout(pa, a) == _layout(pb, b) is not None:  # equal layouts: equal keys, without writing layers out
        return BlockDiff(a, b, identical, first_a, first_b, True, (), signature_changed)
    ka, kb = _keys(pa, a), _keys(pb, b)
    if ka is None or kb is None:
        return BlockDiff(a, b, identical, first_a, first_b, None, (), signature_changed)
    changes = [f"-{k} {list(v)}" for k, v in ka.items() if kb.get(k) != v]
    changes += [f"+{k} {list(v)}" for k, v in kb.items() if ka.get(k) != v]
    return BlockDiff(a, b, identical, first_a, first_b, not changes, tuple(changes), signature_changed)


def format_diff(d: BlockDiff, name_a: str, name_b: str) -> str:
    lines = [f"--- {name_a}: {d.a.kind} {d.a.name}", f"+++ {name_b}: {d.b.kind} {d.b.name}"]
    if not d.identical:
        if d.signature_changed:
            lines.append(f"  signature: ({', '.join(str(p.type) for p in d.a.params)}) -> {d.a.result}  vs  "
                         f"({', '.join(str(p.type) for p in d.b.params)}) -> {d.b.result}")
        lines.append("  first difference:")
        for name, op in ((name_a, d.first_a), (name_b, d.first_b)):
            text = _describe(op)
            where = str(op.span) if op is not None else name
            lines.append(f"    {where}: {text}")
        decl_a, decl_b = (getattr(op, "decl", None) for op in (d.first_a, d.first_b))
        if decl_a is not None and decl_a == decl_b and _decl(d.a, decl_a) != _decl(d.b, decl_b):
            lines.append(f"    declarations: {_decl(d.a, decl_a)}  vs  {_decl(d.b, decl_b)}")
        lines += [f"  {c}" for c in d.key_changes]
    lines.append(d.verdict)
    return "\n".join(lines)


def _describe(op: O.Op | None) -> str:
    return format_op(op) if op is not None else "(nothing: every op has a counterpart)"
