"""Whether two blocks compute one function, and whether they own the same parameter keys.

The one equivalence that ``blockir diff`` and the migration's function check share, so they agree
on every pair. Each block becomes a graph in canonical form:

- an op is labelled by its kind and its attributes, every constant expression folded to its value
  (``heads=H`` with ``H = 4`` is ``heads=4``; ``2 * 2`` is ``4``), every other name resolved; each
  kind's ``EQUIVALENCE`` hook (``blockir/ops/<kind>.py``) names the kind and the value that keys
  its random mask, through :meth:`_Builder.label`;
- a declaration an op applies is a node of its own, labelled by what it is (kind and folded
  arguments; a block call by the class of the block it calls; a stack by its layer's class and its
  folded count), with an edge to every op that applies it, so a tied declaration differs from two
  equal ones;
- an edge says which operand position it feeds and which result of its producer it reads;
- inputs are labelled by position and type, the output by the block's result types.

Value names and the order of lines and declarations play no part, except a dropout's own name,
which keys its random mask (two spellings that draw different masks in training are different
functions). Two graphs are equal when ``networkx`` finds an isomorphism that keeps every label.
Blocks are interned into classes of equal graphs across both programs, so a call is compared
through the block it calls, however deeply blocks nest.

The function form leaves declaration names out; the named form keeps them (and every declaration,
used or not) and so decides the parameter keys without sizing any dim.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

import networkx as nx
from networkx.algorithms.isomorphism import categorical_edge_match, categorical_node_match

from blockir.ir import consts as C
from blockir.ir.decls import Decl, ExternDecl, InstanceDecl, KindDecl
from blockir.ir.hooks import EQUIVALENCE
from blockir.ir.program import Block, Program
from blockir.ir.traits import BlockInput
from blockir.ir.types import TensorType
from blockir.ops import Op

# the categories of a comparison, from closest to farthest
IDENTICAL = "identical"  # one function, the same parameter keys
RENAMED = "renamed keys"  # one function, the same tensors under other key names
SAME_FUNCTION = "same function, different keys"  # one function; keys added, dropped or reshaped
DIFFERENT = "different function"
CATEGORIES = (IDENTICAL, RENAMED, SAME_FUNCTION, DIFFERENT)

NODE = categorical_node_match("label", None)
EDGE = categorical_edge_match("index", None)
View = Callable[[Block], Block]


def _identity(block: Block) -> Block:
    return block


def fold(expr: C.ConstExpr, defs: Mapping[str, C.ConstExpr], seen: frozenset[str] = frozenset()) -> C.ConstExpr:
    """``expr`` with every constant and sized dim replaced by its definition and every closed subexpression
    evaluated; unsized dims and the per-layer names stay names (so does a constant met again inside its own
    definition)."""
    if isinstance(expr, C.Name):
        if expr.name in defs and expr.name not in seen:
            return fold(defs[expr.name], defs, seen | {expr.name})
        return expr
    if isinstance(expr, C.Neg):
        out: C.ConstExpr = C.Neg(fold(expr.operand, defs, seen))
    elif isinstance(expr, C.Bin):
        out = C.Bin(expr.op, fold(expr.left, defs, seen), fold(expr.right, defs, seen))
    else:
        return expr
    if C.names_in(out):
        return out
    try:
        return C.Num(C.evaluate(out, {}))
    except C.ConstError:  # out of range or a division by zero: the verifier reports it; compare the text
        return out


def _text(value: Any, defs: Mapping[str, C.ConstExpr]) -> Any:
    if isinstance(value, C.EXPRS):
        folded = fold(value, defs)
        # one number however it is spelt: the compiler reads `10000` and `10000.0` alike
        return repr(float(folded.value)) if isinstance(folded, C.Num) else C.format_expr(folded)
    if isinstance(value, TensorType):
        return _type_text(value, defs)
    if isinstance(value, tuple):
        return tuple(_text(v, defs) for v in value)
    return repr(value)


def _type_text(t: TensorType, defs: Mapping[str, C.ConstExpr]) -> str:
    """A tensor type with each axis size folded through the file's dims and constants: ``F = 2 * D`` and
    ``F = 128`` with ``D = 64`` are one axis (the files are compared at the sizes they declare)."""
    axes = ", ".join(f"{a.name}:{a.role.value}" + (f"={_text(a.size, defs)}" if a.size is not None else "")
                     for a in t.axes)
    return f"[{axes}] {t.dtype}"


class Interner:
    """Numbers the classes of equal block graphs seen so far, across any number of programs."""

    def __init__(self, named: bool) -> None:
        self.named = named
        self.buckets: dict[int, list[tuple[nx.DiGraph, int]]] = {}
        self.count = 0
        self.memo: dict[tuple[int, int, str], int] = {}
        self.graphs: dict[tuple[int, int, str], nx.DiGraph] = {}

    def graph(self, program: Program, block: Block, view: View = _identity) -> nx.DiGraph:
        key = (id(program), id(view), block.name)
        if key not in self.graphs:
            self.graphs[key] = _Builder(self, program, view(block), view).graph()
        return self.graphs[key]

    def klass(self, program: Program, name: str, view: View = _identity) -> int:
        """The class of block ``name`` of ``program`` (as ``view`` shows it)."""
        key = (id(program), id(view), name)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = -1  # a call cycle (the builder reports it) must not recurse forever
        g = self.graph(program, program.block(name), view)
        bucket = self.buckets.setdefault(g.graph["hash"], [])
        found = next((k for rep, k in bucket if same_graph(rep, g)), None)
        if found is None:
            found = self.count
            self.count += 1
            bucket.append((g, found))
        self.memo[key] = found
        return found


def same_graph(a: nx.DiGraph, b: nx.DiGraph) -> bool:
    return a.graph["hash"] == b.graph["hash"] and nx.is_isomorphic(a, b, node_match=NODE, edge_match=EDGE)


class _Builder:
    """The canonical graph of one block, with structural hashes per op for locating a difference."""

    def __init__(self, interner: Interner, program: Program, block: Block, view: View) -> None:
        self.interner, self.program, self.block, self.view = interner, program, block, view
        self.defs = {**{a.name: a.size for a in program.dims if a.size is not None},
                     **{c.name: c.value for c in (*program.consts, *block.consts)}}

    def decl_label(self, d: Decl) -> tuple:
        name = (d.name,) if self.interner.named else ()
        if isinstance(d, InstanceDecl):
            callee = self.interner.klass(self.program, d.block, self.view) if d.block in self.program.block_map \
                else d.block
            count = _text(d.count, self.defs) if d.count is not None else None
            return ("instance", callee, count, *name)
        if isinstance(d, ExternDecl):
            return ("extern", tuple((_type_text(p.type, self.defs), p.layout) for p in d.params),
                    _type_text(d.result, self.defs), d.result_layout, *name)
        assert isinstance(d, KindDecl)
        return ("kind", d.kind, tuple((k, _text(v, self.defs)) for k, v in d.args), *name)

    def input_label(self, op: Op) -> tuple:
        """A block parameter: its position, type and placement (its name plays no part)."""
        index = [p.name for p in self.block.params].index(op.result)
        return ("input", index, _type_text(op.type, self.defs), self.block.params[index].layout)

    def output_label(self, op: Op) -> tuple:
        """The return: the block's result types and placement."""
        return ("output", tuple(_type_text(t, self.defs) for t in self.block.results), self.block.result_layout,
                self.block.kind)

    def label(self, op: Op, kind: str, site: str | None = None) -> tuple:
        """An op of ``kind``: its number of results, the name keying its random mask (``site``, which the
        backends hash) and every attribute that is neither a value, a result nor a declaration, folded."""
        attrs = []
        for f in fields(op):  # type: ignore[arg-type]
            role = f.metadata.get("role")
            if f.name == "span" or role in ("value", "result", "decl"):
                continue  # values are edges, declarations are nodes, result names are not part of it
            attrs.append((f.name, _text(getattr(op, f.name), self.defs)))
        return (kind, len(op.results), site, tuple(attrs))

    def graph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        block = self.block
        where: dict[str, tuple[int, int]] = {}
        decl_nodes: dict[str, str] = {}
        value_hash: dict[str, int] = {}
        op_hashes: list[int] = []
        decl_hash: dict[str, int] = {}
        for d in block.decls if self.interner.named else ():  # every declaration owns keys, used or not
            decl_nodes[d.name] = f"decl:{d.name}"
            g.add_node(decl_nodes[d.name], label=self.decl_label(d))
        for i, op in enumerate(block.ops):
            label = EQUIVALENCE.of(op)(op, self)
            g.add_node(i, label=label)
            applied = []
            for f in fields(op):  # type: ignore[arg-type]
                if f.metadata.get("role") != "decl" or getattr(op, f.name) is None:
                    continue
                d = block.decl_map[getattr(op, f.name)]
                if d.name not in decl_nodes:
                    decl_nodes[d.name] = f"decl:{d.name}"
                    g.add_node(decl_nodes[d.name], label=self.decl_label(d))
                if d.name not in decl_hash:
                    decl_hash[d.name] = hash(g.nodes[decl_nodes[d.name]]["label"])
                g.add_edge(decl_nodes[d.name], i, index=("decl", f.name))
                applied.append((f.name, decl_hash[d.name]))
            reads = []
            for k, v in enumerate(op.operands):
                producer, position = where[v]
                g.add_edge(producer, i, index=(k, position))
                reads.append(value_hash[v])
            h = hash((label, tuple(applied), tuple(reads)))
            op_hashes.append(h)
            for position, r in enumerate(op.results):
                where[r] = (i, position)
                value_hash[r] = hash((h, position))
        decls = sorted(hash(g.nodes[n]["label"]) for n in decl_nodes.values())
        g.graph["hash"] = hash((tuple(sorted(op_hashes)), tuple(decls)))
        g.graph["op_hashes"] = op_hashes
        return g


def first_unmatched(block: Block, mine: list[int], theirs: list[int]) -> Op | None:
    """The first op of ``block`` whose structural hash the other side lacks (inputs aside)."""
    pool = Counter(theirs)
    for op, h in zip(block.ops, mine):
        if pool[h] > 0:
            pool[h] -= 1
        elif not op.has(BlockInput):
            return op
    return None


@dataclass(frozen=True)
class Comparison:
    """Two blocks compared in canonical form."""

    a: Block
    b: Block
    same_function: bool
    same_names: bool  # the named forms agree too: the same parameter keys for any sizes
    first_a: Op | None  # where the functions first differ: an op of a with no counterpart in b
    first_b: Op | None
    where_a: Block  # the blocks those ops belong to: the innermost pair of one name that differs
    where_b: Block


def _called(program: Program, block: Block) -> list[str]:
    """The blocks ``block`` calls, directly or through others, innermost first."""
    order: list[str] = []
    seen = {block.name}
    todo = [block]
    while todo:
        for d in todo.pop().decls:
            if isinstance(d, InstanceDecl) and d.block in program.block_map and d.block not in seen:
                seen.add(d.block)
                order.append(d.block)
                todo.append(program.block(d.block))
    return order[::-1]


def compare(pa: Program, a: Block, pb: Program, b: Block, view_b: View = _identity) -> Comparison:
    """Compare ``a`` with ``b`` (as ``view_b`` shows each block of ``pb``)."""
    function, named = Interner(named=False), Interner(named=True)
    same_function = function.klass(pa, a.name) == function.klass(pb, b.name, view_b)
    same_names = same_function and named.klass(pa, a.name) == named.klass(pb, b.name, view_b)
    if same_function:
        return Comparison(a, b, True, same_names, None, None, a, b)
    where_a, where_b = a, b
    inner_b = set(_called(pb, b))
    for name in _called(pa, a):  # the innermost pair of one name whose functions differ holds the difference
        if name in inner_b and function.klass(pa, name) != function.klass(pb, name, view_b):
            where_a, where_b = pa.block(name), pb.block(name)
            break
    ga, gb = function.graph(pa, where_a), function.graph(pb, where_b, view_b)
    ha, hb = ga.graph["op_hashes"], gb.graph["op_hashes"]
    shown_b = view_b(where_b)
    return Comparison(a, b, False, False, first_unmatched(where_a, ha, hb), first_unmatched(shown_b, hb, ha),
                      where_a, shown_b)


def category(comparison: Comparison, same_keys: bool | None, same_shapes: bool) -> str:
    """The category of a comparison, given whether the key tables are equal (None: not sized, so not
    compared) and whether their shapes agree as multisets (what a pure rename keeps)."""
    if not comparison.same_function:
        return DIFFERENT
    if comparison.same_names or same_keys:
        return IDENTICAL
    return RENAMED if same_keys is False and same_shapes else SAME_FUNCTION
