"""Block summaries: what a block does, as seen from a call to it.

A verifier that meets a call to another block must know what happens inside
without walking into it again (that made nested programs cubic, and deep
ones overflow the stack). Each block is summarised once, callees first (a
topological order of the call graph, computed iteratively with networkx),
and the summary is all a caller consults:

* whether it normalizes anywhere, whether its output is normalized, and
  whether it returns a residual stream it left unnormalized (a model that
  returns it needs a final norm);
* the branch kinds along its stream, in order, through the blocks it calls
  (an encoder–decoder decoder runs self-attention, cross-attention, MLP);
* whether it holds cross-attention and which of its inputs it reads as
  encoder memory; its first non-causal self-attention;
* whether it has no residual update of its own and drops the value it is
  given (a dropout helper: legal on a branch output, not on the stream);
* the first untied norm it applies (one instance called on two values ties
  that norm's scale) and the epsilons of its norms by family;
* for each attention-score input and result (RealFormer's carried scores),
  the attention families that read or produce it;
* how its result relates to its first input: returned through casts,
  constant scales and dropout only (a shortcut helper: the dropout and the
  constant on the way); carried unchanged beside un-normalized updates (a
  residual update of its own: wrapped as a branch, the caller's shortcut is
  counted twice); carried at all (any update with a shortcut, through its
  calls); or replaced by a computation with no update carrying it (a layer
  with no shortcut), and which op replaces it;
* the head it applies to its first input without normalizing it (a model
  calling it on a Pre-LN stack's output needs a final norm before it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import networkx as nx

from blockir.analyses.cache import per_object
from blockir.analyses import carry
from blockir.analyses.carry import Passthrough
from blockir.analyses.calls import Declared, callee, output_source
from blockir.norms import family
from blockir.analyses.facts import stated
from blockir.analyses.sizes import block_env, program_env, value
from blockir.analyses.structure import ancestors, decl_kind, wrapper
from blockir.diagnostics import Span
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.analyses.block_queries import applies_norm, has
from blockir.ir.traits import AddNorm, Calls, Normalizes, Stochastic
from blockir.ops import Op
from blockir.ir.program import Block, Program

CALLS = ("block", "stack")


@dataclass(frozen=True)
class EpsCount:
    value: float | int
    count: int
    decl: KindDecl
    owner: str  # the block that declares it


@dataclass(frozen=True)
class Summary:
    name: str
    has_norms: bool = False
    ends_normalized: bool = False
    unnormalized_stream: bool = False
    takes_state: Declared | None = None  # the update that continues the first input as an un-normalized state
    stream_kinds: tuple[str, ...] = ()
    has_cross: bool = False
    memory_params: frozenset[int] = frozenset()
    noncausal_self: Declared | None = None
    drops_state: bool = False
    untied_norm: Declared | None = None
    eps: Mapping[str, tuple[EpsCount, ...]] = field(default_factory=dict)
    score_readers: Mapping[int, frozenset[str]] = field(default_factory=dict)  # input index -> families
    score_writers: Mapping[int, frozenset[str]] = field(default_factory=dict)  # result index -> families
    passes_input: Passthrough | None = None
    identity_route: Span | None = None  # the first add of a block that returns x + updates, x its first input
    carries: bool = False  # some update with a shortcut carries the first input forward
    replaces_state: Declared | None = None  # the op computing the result from the input with no shortcut
    raw_head: Declared | None = None  # a head applied to the first input with no norm between


def stream_items(program: Program, block: Block, summaries: Mapping[str, Summary]) -> list[tuple[str, str, Op]]:
    """(branch kind, its name, the local op that runs it) along the stream, expanding calls once."""
    w = wrapper(block)
    roots = {id(s.root): s for s in w.sublayers}
    items: list[tuple[str, str, Op]] = []
    for op in block.ops:
        sub = roots.get(id(op))
        if sub is not None:
            for b in sub.branches:
                d = callee(program, block, b.call) if b.call is not None else None
                if d is not None and b.kind in CALLS:
                    items += [(k, d.name, b.call) for k in summaries[d.block].stream_kinds]  # type: ignore[misc]
                else:
                    items.append((b.kind, b.name, b.call or block.producers[b.leaf]))
            continue
        d = callee(program, block, op)
        if d is not None and op.result in w.spine_set:
            items += [(k, d.name, op) for k in summaries[d.block].stream_kinds]
    return items


KEEP = 4  # kinds kept at each end of a long stream


def _bounded(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Repeats collapsed, then the two ends of a long stream: a caller checks order only where its own
    steps meet this block's, and this block reports disorder inside itself."""
    collapsed = tuple(k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k)
    return collapsed if len(collapsed) <= 2 * KEEP else collapsed[:KEEP] + collapsed[-KEEP:]


def memory_inputs(block: Block) -> set[str]:
    return {op.result for op in block.inputs} - {wrapper(block).state_input}


def _memory_params(program: Program, block: Block, summaries: Mapping[str, Summary]) -> frozenset[int]:
    names = [op.result for op in block.inputs]
    memory = memory_inputs(block)
    read: set[str] = set()
    for op in block.ops:
        if has(op, Calls) and decl_kind(block, op) == "cross_attention" and len(op.args) == 2:
            read |= ancestors(block, op.args[1]) & memory
        d = callee(program, block, op)
        if d is not None:
            for j in summaries[d.block].memory_params:
                if j < len(op.args):
                    read |= ancestors(block, op.args[j]) & memory
    return frozenset(i for i, n in enumerate(names) if n in read)


def _noncausal(program: Program, block: Block, summaries: Mapping[str, Summary]) -> Declared | None:
    for d in block.decls:
        if isinstance(d, KindDecl) and d.kind == "self_attention" and d.arg("causal") is False:
            return Declared(d.name, d.span)
        if isinstance(d, InstanceDecl) and d.block in summaries and summaries[d.block].noncausal_self is not None:
            inner = summaries[d.block].noncausal_self
            return Declared(f"{d.name}.{inner.path}", inner.span)  # type: ignore[union-attr]
    return None


def _untied_norm(block: Block, summaries: Mapping[str, Summary]) -> Declared | None:
    for d in block.decls:
        if isinstance(d, KindDecl) and d.category == "norm" and not d.arg("tied") and family(d).keys(d, (1,)) \
                and any(getattr(op, "decl", None) == d.name for op in block.ops):
            return Declared(d.name, d.span)
        if isinstance(d, InstanceDecl) and d.block in summaries and summaries[d.block].untied_norm is not None:
            inner = summaries[d.block].untied_norm
            return Declared(f"{d.name}.{inner.path}", inner.span)  # type: ignore[union-attr]
    return None


def _eps(block: Block, env: dict, summaries: Mapping[str, Summary]) -> dict[str, tuple[EpsCount, ...]]:
    """Norm epsilons by family over the block and the blocks it instantiates, first seen first."""
    out: dict[str, dict[float | int, EpsCount]] = {}

    def add(family: str, entry: EpsCount) -> None:
        seen = out.setdefault(family, {})
        old = seen.get(entry.value)
        seen[entry.value] = entry if old is None else EpsCount(old.value, old.count + entry.count, old.decl, old.owner)

    for d in block.decls:
        if isinstance(d, KindDecl) and d.category == "norm" and d.arg("eps") is not None:
            v = value(d.arg("eps"), env)
            if v is not None:
                add(d.kind, EpsCount(v, 1, d, block.name))
        elif isinstance(d, InstanceDecl) and d.block in summaries:
            for family, entries in summaries[d.block].eps.items():
                for e in entries:
                    add(family, e)
    return {family: tuple(seen.values()) for family, seen in out.items()}


def score_family(block: Block, op: Op) -> str | None:
    """The attention family of a call that carries scores: their axes and masks differ by family."""
    d = block.decl_map.get(getattr(op, "decl", None) or "")
    if not has(op, Calls) or not isinstance(d, KindDecl) or d.arg("score_residual") is None:
        return None
    if d.kind == "cross_attention":
        return "cross-attention"
    return "causal self-attention" if d.arg("causal") else "bidirectional self-attention"


def score_routes(program: Program, block: Block, summaries: Mapping[str, Summary]
                 ) -> dict[str, list[tuple[str, Op]]]:
    """Each value that carries scores, with the attention families (and the calls) that write or read it."""
    out: dict[str, list[tuple[str, Op]]] = {}
    for op in block.ops:
        if not has(op, Calls):
            continue
        f = score_family(block, op)
        if f is not None:
            for v in (op.args[-1], *op.more):
                out.setdefault(v, []).append((f, op))
        d = callee(program, block, op)
        if d is None:
            continue
        s = summaries[d.block]
        for j, families in s.score_readers.items():
            if j < len(op.args):
                out.setdefault(op.args[j], []).extend((f, op) for f in sorted(families))
        for j, families in s.score_writers.items():
            if 0 < j <= len(op.more):
                out.setdefault(op.more[j - 1], []).extend((f, op) for f in sorted(families))
    return out


def _scores(program: Program, block: Block, summaries: Mapping[str, Summary]
            ) -> tuple[dict[int, frozenset[str]], dict[int, frozenset[str]]]:
    routes = score_routes(program, block, summaries)
    readers = {i: frozenset(f for f, _ in routes[p.result]) for i, p in enumerate(block.inputs) if p.result in routes}
    out = block.output
    writers = {i: frozenset(f for f, _ in routes[v]) for i, v in enumerate(out.values if out else ()) if v in routes}
    return readers, writers


def _takes_state(program: Program, block: Block, env: dict, summaries: Mapping[str, Summary]) -> Declared | None:
    """The update that adds to the block's first input without normalizing its sum (Pre-LN's ``x + f(norm(x))``):
    handed a normalized value, the block would continue the stream from it. None when the block states
    ``residual_from_norm`` or normalizes that sum (Post-LN)."""
    fact = stated(block, env).get("residual_from_norm")
    if not block.params or fact is not None and fact.value == 1:
        return None
    state = block.params[0].name
    for s in wrapper(block).sublayers:
        if s.state == state:
            fused = has(s.root, AddNorm)
            return None if s.post_norm is not None or fused else Declared(block.name, s.root.span)
    for op in block.ops:  # a block that only hands its input on: the callee that continues it
        d = callee(program, block, op)
        if d is not None and op.args and op.args[0] == state:  # type: ignore[attr-defined]
            return summaries[d.block].takes_state
    return None


def _summarise(program: Program, block: Block, env: dict, summaries: Mapping[str, Summary]) -> Summary:
    w = wrapper(block)
    readers, writers = _scores(program, block, summaries)
    calls = [(op, d) for op in block.ops if (d := callee(program, block, op)) is not None]
    inner = [summaries[d.block] for _, d in calls]
    has_norms = any(has(op, Normalizes) for op in block.ops) or any(s.has_norms for s in inner)
    v, out = output_source(block)
    out_call = callee(program, block, out) if out is not None else None
    if applies_norm(out) or has(out, AddNorm) and v == out.normalized:
        ends = True
    else:
        ends = out_call is not None and summaries[out_call.block].ends_normalized
    returns_stream = bool(w.sublayers) or out_call is not None and summaries[out_call.block].unnormalized_stream
    drops = not w.sublayers and any(
        has(p := block.producers.get(s), Stochastic) and value(p.p, env) != 0
        or (d := callee(program, block, p)) is not None and summaries[d.block].drops_state
        for s in w.spine[1:])
    carried = carry.carries(program, block, env, summaries)
    return Summary(
        block.name, has_norms=has_norms, ends_normalized=ends,
        unnormalized_stream=has_norms and not ends and returns_stream,
        takes_state=_takes_state(program, block, env, summaries),
        stream_kinds=_bounded(tuple(k for k, _, _ in stream_items(program, block, summaries))),
        has_cross=any(decl_kind(block, op) == "cross_attention" for op in block.ops) or any(s.has_cross for s in inner),
        memory_params=_memory_params(program, block, summaries),
        noncausal_self=_noncausal(program, block, summaries), drops_state=drops,
        untied_norm=_untied_norm(block, summaries), eps=_eps(block, env, summaries),
        score_readers=readers, score_writers=writers,
        passes_input=carry.passthrough(program, block, env, summaries),
        identity_route=carry.identity_route(program, block, summaries),
        carries=carried, replaces_state=carry.replaces_state(program, block, summaries, carried),
        raw_head=carry.raw_head(program, block, summaries))


def call_graph(program: Program) -> nx.DiGraph:
    """Blocks as nodes, an edge from each block to every block it instantiates."""
    g = nx.DiGraph()
    g.add_nodes_from(b.name for b in program.blocks)
    g.add_edges_from((b.name, d.block) for b in program.blocks for d in b.decls
                     if isinstance(d, InstanceDecl) and d.block in program.block_map)
    return g


def callees_first(program: Program) -> list[str]:
    """Block names with every callee before its callers (cycles, reported by the builder, are broken)."""
    g = call_graph(program)
    g.remove_edges_from(list(nx.selfloop_edges(g)))
    if not nx.is_directed_acyclic_graph(g):
        g = nx.condensation(g)
        return [n for c in reversed(list(nx.topological_sort(g))) for n in sorted(g.nodes[c]["members"])]
    return list(reversed(list(nx.topological_sort(g))))


class Summaries(dict):
    """The summary of every block by name, and the set of blocks some block calls.

    A callee not yet summarised (only inside a cycle, which the builder
    reports) reads as an empty summary.
    """

    def __init__(self, called: frozenset[str]) -> None:
        super().__init__()
        self.called = called

    def __missing__(self, name: str) -> Summary:
        return Summary(name)


@per_object
def summaries(program: Program) -> Summaries:
    """The summary of every block, computed once per program object."""
    base = program_env(program)
    out = Summaries(frozenset(d.block for b in program.blocks for d in b.decls if isinstance(d, InstanceDecl)))
    for name in callees_first(program):
        block = program.block(name)
        out[name] = _summarise(program, block, block_env(base, block), out)
    return out


def called_blocks(program: Program) -> frozenset[str]:
    """Blocks that some block instantiates."""
    return summaries(program).called
