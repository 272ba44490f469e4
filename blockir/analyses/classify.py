"""Topology classification: name each block after the topology registry (docs/verifiers.md).

The block's residual wrapper is condensed into a small graph (state, norm,
branch and add nodes; see :func:`wrapper_graph`) and matched, by labelled
graph isomorphism, against one pattern per registry entry built for the same
number of updates. Refinements then name the recipes the examples use
(scaled residual, ReZero, LayerScale, DyT); models that call other blocks are
stacks. The verifier half of this pass reports blocks whose updates disagree
on norm placement and declared facts the graph contradicts.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import networkx as nx
from networkx.algorithms.isomorphism import categorical_node_match

from blockir.analyses.facts import stated
from blockir.analyses.sizes import block_env, program_env, value
from blockir.analyses.summaries import callees_first, output_source
from blockir.analyses.structure import Sublayer, Wrapper, normalized_shortcut, retracted, wrapper
from blockir.ir.decls import InstanceDecl
from blockir.analyses.block_queries import applies_norm, has
from blockir.ir.traits import Calls
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.norms.dyt import FAMILY as DYT

Shape = tuple[int, ...]  # branches per residual update


def _builder() -> tuple[nx.DiGraph, Callable[[str], int]]:
    g = nx.DiGraph()

    def node(label: str) -> int:
        n = g.number_of_nodes()
        g.add_node(n, label=label)
        return n
    return g, node


def _sequential(pre: bool, out: bool, post: bool) -> Callable[[Shape], nx.DiGraph | None]:
    def build(shape: Shape) -> nx.DiGraph | None:
        if not shape or any(k != 1 for k in shape):
            return None
        g, node = _builder()
        prev = node("state")
        for _ in shape:
            add, branch = node("add"), node("branch")
            g.add_edge(prev, add)  # the shortcut
            if pre:
                norm = node("norm")
                g.add_edges_from([(prev, norm), (norm, branch)])
            else:
                g.add_edge(prev, branch)
            tail = branch
            if out:
                tail = node("norm")
                g.add_edge(branch, tail)
            g.add_edge(tail, add)
            prev = add
            if post:
                norm = node("norm")
                g.add_edge(add, norm)
                prev = norm
        return g
    return build


def _parallel(shared: bool) -> Callable[[Shape], nx.DiGraph | None]:
    def build(shape: Shape) -> nx.DiGraph | None:
        if len(shape) != 1 or shape[0] < 2:
            return None
        g, node = _builder()
        state, add = node("state"), node("add")
        g.add_edge(state, add)
        norm = node("norm") if shared else None
        if norm is not None:
            g.add_edge(state, norm)
        for _ in range(shape[0]):
            branch = node("branch")
            own = norm if norm is not None else node("norm")
            g.add_edges_from([(state, own), (own, branch), (branch, add)])
        return g
    return build


def _normformer(shape: Shape) -> nx.DiGraph | None:
    """Pairs of Pre-LN updates: ``x + N(A(N(x)))`` then ``h + M(N(h))`` with a norm inside M."""
    if not shape or len(shape) % 2 or any(k != 1 for k in shape):
        return None
    g, node = _builder()
    prev = node("state")
    for i in range(len(shape)):
        add, branch, norm = node("add"), node("branch"), node("norm")
        g.add_edges_from([(prev, add), (prev, norm), (norm, branch)])
        if i % 2 == 0:
            out = node("norm")
            g.add_edges_from([(branch, out), (out, add)])
        else:
            g.add_edges_from([(branch, node("inner_norm")), (branch, add)])
        prev = add
    return g


@dataclass(frozen=True)
class Topology:
    name: str
    equation: str
    pattern: Callable[[Shape], nx.DiGraph | None]


# the topology registry, in the order patterns are tried
REGISTRY: tuple[Topology, ...] = (
    Topology("post_ln", "N(x + F(x))", _sequential(pre=False, out=False, post=True)),
    Topology("pre_ln", "x + F(N(x))", _sequential(pre=True, out=False, post=False)),
    Topology("peri_ln", "x + N_out(F(N_in(x)))", _sequential(pre=True, out=True, post=False)),
    Topology("branch_output_norm", "x + N(F(x))", _sequential(pre=False, out=True, post=False)),
    Topology("no_norm", "x + F(x)", _sequential(pre=False, out=False, post=False)),
    Topology("parallel", "x + A(N_A(x)) + M(N_M(x))", _parallel(shared=False)),
    Topology("parallel_shared_norm", "x + A(N(x)) + M(N(x))", _parallel(shared=True)),
    Topology("normformer", "x + N(HeadScale(A(N(x)))), h + W2(N(act(W1(N(h)))))", _normformer),
)
# names given by refinement rather than by a pattern of their own
RECIPES = {
    "scaled_residual": "N(a * x + F(x)) or a * x + F(N(x)): a constant shortcut scale (DeepNorm, DeepScaleLM)",
    "rezero": "x + a * F(x): a learned scalar gate, initialized to zero, and no norm",
    "layerscale": "x + diag(g) * F(N(x)): Pre-LN with a learned per-channel gain on each branch",
    DYT.name: "x + F(DyT(x)): Pre-LN with Dynamic Tanh in place of every norm",
    "fixup": "x + s * F(x + a) + b: no norm, a scalar multiplier and scalar biases on every branch (Fixup, "
             "stated with const fixup = 1)",
    "deepscalelm": "lambda * x + beta * F(x) with lambda^2 + beta^2 = 1 (DeepScaleLM, stated with "
                   "const deepscalelm = 1)",
    "stack": "layers applied in sequence, optionally closed by a final norm",
    "residual_from_norm": "y = N(h) + F(N(h)): an update continues the stream from a normalized value "
                          "(stated with const residual_from_norm = 1)",
    "ngpt": "unit(x + a * (unit(F(x)) - x)): normalized interpolation on the hypersphere, a learned vector a (nGPT)",
    "mixed": "updates disagree on where they normalize",
    "custom": "a residual wrapper outside the registry",
}
MATCH = categorical_node_match("label", None)


def wrapper_graph(w: Wrapper) -> nx.DiGraph:
    """The condensed view matched against the registry: one node per state, norm, branch and add."""
    g = nx.DiGraph()
    g.add_node("state", label="state")
    roots = {s.result if s.post_norm is None else s.root.result: s for s in w.sublayers}
    posts = {s.post_norm.result for s in w.sublayers if s.post_norm is not None}
    prev = "state"
    for v in w.spine[1:]:
        if v in posts:
            continue  # added with its sublayer
        sub = roots.get(v)
        if sub is None:
            g.add_node(v, label="other")
            g.add_edge(prev, v)
            prev = v
            continue
        prev = _add_sublayer(g, sub, prev)
    return g


def _add_sublayer(g: nx.DiGraph, sub: Sublayer, prev: str) -> str:
    add = f"add:{sub.root.result}"
    g.add_node(add, label="add")
    g.add_edge(prev, add)
    for i, b in enumerate(sub.branches):
        node = f"branch:{sub.root.result}:{i}"
        g.add_node(node, label="branch")
        for n in b.pre_norms:
            norm = f"norm:{n.result}"
            if norm not in g:  # a fused add+norm's norm sits on the stream before the branch
                g.add_node(norm, label="norm")
                g.add_edge(prev, norm)
            g.add_edge(norm, node)
        if not b.pre_norms:
            g.add_edge(prev, node)
        for op in b.ops:
            if applies_norm(op) and op is not b.out_norm and op not in b.pre_norms:
                # a norm inside the branch (NormFormer's FFN norm) is outside every registry pattern
                g.add_node(f"norm:{op.result}", label="inner_norm")
                g.add_edge(node, f"norm:{op.result}")
        tail = node
        if b.out_norm is not None:
            tail = f"norm:{b.out_norm.result}"
            g.add_node(tail, label="norm")
            g.add_edge(node, tail)
        g.add_edge(tail, add)
    if sub.post_norm is None and not sub.fused_post:
        return add
    post = f"norm:{sub.result}"
    g.add_node(post, label="norm")
    g.add_edge(add, post)
    return post


def normformer_missing(block: Block, w: Wrapper) -> list[tuple[str, Sublayer]]:
    """The parts of NormFormer's contract (arXiv:2110.09456) a block lacks, each with the update that lacks it.

    Every attention update must read a normalized state, scale each head (``head_scale=true``) and
    normalize its output; every other update must read a normalized state and normalize inside its
    branch (after the first projection and activation).
    """
    out: list[tuple[str, Sublayer]] = []
    for s in w.sublayers:
        for b in s.branches:
            decl = block.decl_map.get(getattr(b.call, "decl", "") or "")
            attention = getattr(decl, "kind", "") in ("self_attention", "cross_attention")
            if not b.pre_norms:
                out.append((f"a norm on the input of '{b.name}' (NormFormer keeps Pre-LN)", s))
            if s.post_norm is not None:
                out.append((f"an unnormalized sum after '{b.name}' (NormFormer is Pre-LN)", s))
            if attention and not (decl is not None and decl.arg("head_scale")):
                out.append((f"per-head scales on '{b.name}' (head_scale=true)", s))
            if attention and b.out_norm is None:
                out.append((f"a norm on the output of '{b.name}'", s))
            inner = [op for op in b.ops if applies_norm(op) and op is not b.out_norm
                     and op not in b.pre_norms]
            if not attention and not inner:
                out.append((f"a norm inside the branch through '{b.name}', after its first projection and activation", s))
    return out


def _invariant(g: nx.DiGraph) -> tuple[object, ...]:
    """What an isomorphism keeps: each node's label with its in- and out-degree, as a multiset."""
    return tuple(sorted((str(label), g.in_degree(n), g.out_degree(n)) for n, label in g.nodes(data="label")))


@lru_cache(maxsize=None)
def _patterns(shape: Shape) -> tuple[tuple[str, nx.DiGraph, tuple[object, ...]], ...]:
    """Each registry entry's pattern for ``shape``, with its invariant, in registry order."""
    out = []
    for topo in REGISTRY:
        pattern = topo.pattern(shape)
        if pattern is not None:
            out.append((topo.name, pattern, _invariant(pattern)))
    return tuple(out)


@lru_cache(maxsize=4096)
def _match(shape: Shape, nodes: tuple[object, ...], edges: tuple[object, ...]) -> str | None:
    g = nx.DiGraph()
    g.add_nodes_from((n, {"label": label}) for n, label in nodes)
    g.add_edges_from(edges)
    key = _invariant(g)
    # the invariant rules out almost every entry; VF2 runs only where it cannot
    return next((name for name, pattern, invariant in _patterns(shape)
                 if invariant == key and nx.is_isomorphic(g, pattern, node_match=MATCH)), None)


def match_registry(w: Wrapper) -> str | None:
    """The registry entry whose pattern is isomorphic to the block's condensed graph. Blocks written alike
    (the layers of a file, a block and its printed copy) have equal graphs and share one match."""
    g = wrapper_graph(w)
    shape = tuple(len(s.branches) for s in w.sublayers)
    return _match(shape, tuple(sorted((str(n), str(label)) for n, label in g.nodes(data="label"))),
                  tuple(sorted((str(u), str(v)) for u, v in g.edges())))


@dataclass(frozen=True)
class Member:
    decl: str
    block: str
    count: int | None  # None for a single use
    topology: str


@dataclass(frozen=True)
class Classification:
    block: str
    topology: str
    form: str  # sequential | parallel | stack | none
    placements: tuple[str, ...]  # per residual update
    branch_order: tuple[str, ...]
    members: tuple[Member, ...] = ()
    final_norm: str | None = None


def _gates(block: Block, w: Wrapper) -> set[str]:
    """The kinds of learned scale gating every branch (empty when some branch is ungated)."""
    kinds: set[str] = set()
    for b in (b for s in w.sublayers for b in s.branches):
        learned = [block.decl_map[s.param].kind for s in b.scales if s.param in block.decl_map]
        if not learned:
            return set()
        kinds.update(learned)
    return kinds


def _refine(block: Block, w: Wrapper, base: str, claimed: set[str]) -> str:
    if w.sublayers and all(s.shortcut_scaled for s in w.sublayers):
        return "deepscalelm" if "deepscalelm" in claimed else "scaled_residual"
    if base == "no_norm" and "fixup" in claimed:
        return "fixup"
    gates = _gates(block, w)
    if base == "no_norm" and gates == {"scalar"}:
        return "rezero"
    if base == "pre_ln" and gates == {"vector"}:
        return "layerscale"
    families = {block.decl_map[op.decl].kind for op in block.ops if applies_norm(op)}
    if base == "pre_ln" and families == {DYT.name}:
        return DYT.name
    return base


def _members(program: Program, block: Block, cache: dict[str, Classification]) -> tuple[Member, ...]:
    env = block_env(program_env(program), block)
    out = []
    for op in block.ops:
        decl = block.decl_map.get(getattr(op, "decl", "") or "")
        if has(op, Calls) and isinstance(decl, InstanceDecl) and decl.block in program.block_map:
            count = value(decl.count, env) if decl.count is not None else None
            inner = cache[decl.block]
            out.append(Member(decl.name, decl.block, int(count) if count is not None else None, inner.topology))
    return tuple(out)


def final_norm(block: Block) -> Op | None:
    """The norm that produces the returned value, looking through casts, scales and identities."""
    _, op = output_source(block)
    return op if applies_norm(op) else None


def placements(block: Block, w: Wrapper) -> tuple[str, ...]:
    """Each update's norm placement.

    A norm closing the last update of a pre-normed block is the block's final
    norm, not a Post-LN norm, unless every update normalizes its sum
    (pre+post on every update is one consistent sandwich placement).
    """
    own = tuple(s.placement for s in w.sublayers)
    if not own or len(set(own)) == 1:
        return own
    last = w.sublayers[-1]
    out = block.output.value if block.output is not None else None
    if last.post_norm is not None and last.post_norm.result == out and "pre" in last.placement:
        return own[:-1] + (last.placement.replace("+post", ""),)
    return own


def classify(program: Program, block: Block, cache: dict[str, Classification] | None = None) -> Classification:
    """Name the topology of ``block`` (see REGISTRY and RECIPES); callees are classified first, iteratively."""
    cache = {} if cache is None else cache
    if block.name not in cache:
        for name in callees_first(program):
            if name not in cache:
                cache[name] = _classify_one(program, program.block(name), cache)
    return cache[block.name] if block.name in cache else _classify_one(program, block, cache)


def _classify_one(program: Program, block: Block, cache: dict[str, Classification]) -> Classification:
    w = wrapper(block)
    placed = placements(block, w)
    order = tuple(b.label for s in w.sublayers for b in s.branches)
    members = _members(program, block, cache)
    if not w.sublayers:
        fn = final_norm(block)
        result = Classification(block.name, "stack" if members else "none", "stack" if members else "none",
                                (), (), members, fn.decl if fn is not None and members else None)
    else:
        form = "parallel" if len(w.sublayers) == 1 and len(w.sublayers[0].branches) > 1 else "sequential"
        base = match_registry(w)
        if all(retracted(block, s) for s in w.sublayers):
            name = "ngpt"
        elif any(normalized_shortcut(block, s) is not None for s in w.sublayers):
            name = "residual_from_norm"
        elif base is None:
            name = "mixed" if len(set(placed)) > 1 else "custom"
        else:
            env = block_env(program_env(program), block)
            claimed = {f.name for f in stated(block, env).values() if f.value == 1}
            name = _refine(block, w, base, claimed)
        result = Classification(block.name, name, form, placed, order, members)
    return result


def classify_program(program: Program) -> dict[str, Classification]:
    cache: dict[str, Classification] = {}
    return {b.name: classify(program, b, cache) for b in program.blocks}
