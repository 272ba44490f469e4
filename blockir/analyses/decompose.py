"""How the residual analysis splits a block into sublayers (``blockir.analyses.structure`` explains the model).

The spine comes from immediate dominators of the op graph; each residual sum on it is a sublayer root
whose leaves split into the shortcut and the branches. Op kinds are told apart by their traits.
"""
from __future__ import annotations

from dataclasses import replace

import networkx as nx

from blockir.analyses.block_queries import (applies_norm, decl_kind, gated, has, is_linear, plain_add,
                                            state_input, transparent)
from blockir.analyses.sublayers import Branch, Sublayer, Wrapper
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block
from blockir.ir.traits import (AddNorm, BlockInput, Calls, Difference, Function, Normalizes, ResidualSum,
                               Sink)
from blockir.ops import Op


def _stream_value(block: Block, op: Op) -> str:
    if op.has(AddNorm):
        # a fused op continues the stream through its residual unless only the normalized value is read
        return op.residual if block.users.get(op.residual) else op.normalized  # type: ignore[attr-defined]
    return op.result


def op_graph(block: Block, skip: frozenset[str] = frozenset()) -> nx.DiGraph:
    """Op positions as nodes, an edge from each producer to each of its users (a fused op is one node);
    values in ``skip`` make no edge."""
    where = {r: i for i, op in enumerate(block.ops) for r in op.results}
    g = nx.DiGraph()
    g.add_nodes_from(range(len(block.ops)))
    g.add_edges_from((where[v], i) for i, op in enumerate(block.ops) for v in op.operands
                     if v in where and v not in skip)
    return g


def spine(block: Block, start: str | None) -> tuple[str, ...]:
    """Stream values from the state input to the returned value: the output's dominators."""
    ops = block.ops
    out = next((i for i, op in enumerate(ops) if op.has(Sink)), None)
    first = next((i for i, op in enumerate(ops) if op.has(BlockInput) and op.result == start), None)
    if out is None or first is None:
        return ()
    # carried streams (a score route, a second residual stream) run beside the hidden state, not on it
    carried = frozenset(r for op in ops if op.has(Calls) for r in op.results[1:])
    idom = nx.immediate_dominators(op_graph(block, carried), first)  # covers the ops reachable from the state
    returned = ops[out]
    if returned.more:  # type: ignore[union-attr]  # carried streams leave through the output too
        out = next(i for i, op in enumerate(ops) if returned.value in op.results)  # type: ignore[union-attr]
    if out not in idom:
        return (start,)  # type: ignore[return-value]  # the output does not depend on the state
    chain, node = [], out if returned.more else idom[out]  # type: ignore[union-attr]
    while True:
        chain.append(node)
        if node == first:
            break
        node = idom[node]
    return tuple(_stream_value(block, ops[i]) for i in reversed(chain))


def _sum_tree(block: Block, root: Op, on_spine: frozenset[str], pos: dict[int, int]) -> tuple[list[Op], list[str]]:
    """The adds folded into ``root`` (single-use adds off the spine) and its leaf operands. A fused add+norm
    sums its shortcut and branch operands, so a partial sum feeding it (a parallel block's first update)
    unfolds the same way as under a plain add."""
    adds: list[Op] = []
    leaves: list[str] = []

    def operands(values: tuple[str, ...]) -> None:
        for v in values:
            prod = block.producers.get(v)
            if plain_add(prod) and v not in on_spine and len(block.users.get(v, ())) == 1:
                adds.append(prod)  # type: ignore[arg-type]
                operands(prod.operands)  # type: ignore[union-attr]
            else:
                leaves.append(v)

    if root.has(AddNorm):
        operands((root.shortcut, root.branch))  # type: ignore[attr-defined]
    else:
        adds.append(root)
        operands(root.operands)
    adds.sort(key=lambda a: pos[id(a)])
    return adds, leaves


def _shortcut_path(block: Block, leaf: str, state: str) -> tuple[Op, ...] | None:
    """Ops from ``state`` to ``leaf`` if only modifiers, projections or norms lie between, else None."""
    path: list[Op] = []
    v = leaf
    while v != state:
        op = block.producers.get(v)
        if has(op, AddNorm) and v == op.normalized and op.residual == state:  # type: ignore[union-attr]
            path.append(op)  # type: ignore[arg-type]  # the normalized output of the add that made the state
            break
        gate = gated(block, op)
        if gate is not None:
            path.append(op)  # type: ignore[arg-type]
            v = gate[1]
            continue
        if not (transparent(op) or applies_norm(op) or is_linear(block, op)):
            return None
        path.append(op)  # type: ignore[arg-type]
        v = op.operands[0]  # type: ignore[union-attr]
    return tuple(reversed(path))


def _cost(block: Block, path: tuple[Op, ...]) -> tuple[int, int, int]:
    # the identity (or a scaled or dropped state) beats a projection, which beats a normalized state
    return (sum(op.has(Normalizes) for op in path), sum(is_linear(block, op) for op in path), len(path))


def _closure(block: Block, leaf: str, stop: frozenset[str], pos: dict[int, int]) -> list[Op]:
    seen: set[str] = set()
    ops: list[Op] = []
    stack = [leaf]
    while stack:
        v = stack.pop()
        if v in seen or v in stop:
            continue
        seen.add(v)
        op = block.producers.get(v)
        # a carried stream (the scores an earlier attention returned) arrives from beside the stream
        if op is None or op.has(BlockInput) or v in getattr(op, "more", ()):
            continue
        ops.append(op)
        stack += op.operands
    return sorted({id(op): op for op in ops}.values(), key=lambda op: pos[id(op)])


def branch_kind(block: Block, ops: list[Op]) -> tuple[Op | None, str]:
    """The principal call of a branch and the name of what it computes."""
    # a built-in or bound computation is principal; a called block only when there is none (a block
    # applied on the way, such as a normalizing helper, is not what the branch computes)
    ranked = sorted(ops, key=lambda op: decl_kind(block, op) in ("block", "stack"))
    for op in ranked:
        kind = decl_kind(block, op)
        if kind in ("self_attention", "cross_attention", "mlp", "gated_mlp", "moe", "extern", "block", "stack"):
            if kind == "self_attention":
                decl = block.decl_map.get(getattr(op, "decl", ""))
                causal = isinstance(decl, KindDecl) and decl.arg("causal")
                return op, "causal_self_attention" if causal else "self_attention"
            return op, kind  # type: ignore[return-value]
    linears = [op for op in ops if is_linear(block, op)]
    acts = [op for op in ops if op.has(Function) or decl_kind(block, op) == "activation"]
    if linears:
        return linears[0], "mlp" if len(linears) > 1 and acts else "linear"
    if acts:
        return acts[0], "activation"
    return None, "identity"


def _branch(block: Block, leaf: str, state: str, stop: frozenset[str], state_in: str | None,
            pos: dict[int, int]) -> Branch:
    ops = _closure(block, leaf, stop, pos)
    modifiers: list[Op] = []
    out_norm = None
    v = leaf
    while True:
        op = block.producers.get(v)
        gate = gated(block, op)
        if gate is not None:
            modifiers.append(op)  # type: ignore[arg-type]
            v = gate[1]
            continue
        if has(op, Difference) and op.rhs == state:  # type: ignore[union-attr]
            v = op.lhs  # type: ignore[union-attr]  # an interpolation's step: the branch proposes its minuend
            continue
        if transparent(op):
            modifiers.append(op)  # type: ignore[arg-type]
        elif applies_norm(op) and out_norm is None and v not in stop and op.operand not in stop:  # type: ignore[union-attr]
            out_norm = op
        else:
            break
        v = op.operands[0]  # type: ignore[union-attr]
    core = v  # the value the modifiers and gates wrap
    pre: list[Op] = [op for op in ops if applies_norm(op) and op.operand in stop  # type: ignore[attr-defined]
                     and op is not out_norm]
    for v in {v for op in ops for v in op.operands} | {leaf}:
        fused = block.producers.get(v)
        # reading a fused op's normalized output, when that is not the stream itself, is a pre-norm
        if has(fused, AddNorm) and v == fused.normalized and v != state and fused not in pre:  # type: ignore[union-attr]
            pre.append(fused)  # type: ignore[arg-type]
    # what the branch computes is what its gates pass, not what computes the gates
    call, kind = branch_kind(block, _closure(block, core, stop, pos) if core != leaf else ops)
    reads = {v for op in ops for v in op.operands} | {leaf}
    memory = tuple(op.result for op in block.inputs if op.result in reads and op.result != state_in)
    return Branch(leaf, tuple(ops), call, kind, tuple(pre), out_norm, tuple(modifiers), memory)


def _shared_modifiers(block: Block, leaf: str, stop: frozenset[str],
                      pos: dict[int, int]) -> tuple[list[str], tuple[Op, ...], list[Op]]:
    """Split ``leaf`` when modifiers wrap a sum of branches: ``x + dropout(mlp(n) + attn(n))``.

    Returns the branch leaves, the modifiers they share (add-side first) and
    the inner adds; a leaf that is not such a sum comes back alone.
    """
    outer: list[Op] = []
    v = leaf
    op = block.producers.get(v)
    while transparent(op) and len(block.users.get(v, ())) == 1:
        outer.append(op)  # type: ignore[arg-type]
        v = op.operands[0]  # type: ignore[union-attr]
        op = block.producers.get(v)
    if outer and plain_add(op) and v not in stop and len(block.users.get(v, ())) == 1:
        joins, inner = _sum_tree(block, op, stop, pos)  # type: ignore[arg-type]
        return inner, tuple(outer), joins
    return [leaf], (), []


def _post_norm(block: Block, value: str) -> Op | None:
    users = block.users.get(value, ())
    return users[0] if len(users) == 1 and applies_norm(users[0]) else None


def _sublayer(block: Block, root: Op, state: str, stop: frozenset[str], state_in: str | None,
              pos: dict[int, int]) -> Sublayer:
    adds, leaves = _sum_tree(block, root, stop, pos)
    paths = [(_shortcut_path(block, leaf, state), i) for i, leaf in enumerate(leaves)]
    found = [(p, i) for p, i in paths if p is not None]
    shortcut, shortcut_ops = None, ()
    if found:
        path, i = min(found, key=lambda pi: (_cost(block, pi[0]), pi[1]))
        shortcut, shortcut_ops = leaves[i], path
    branches: list[Branch] = []
    for leaf in leaves:
        if leaf != shortcut:
            inner, outer, joins = _shared_modifiers(block, leaf, stop, pos)
            adds += joins
            branches += [replace(b, modifiers=b.modifiers + outer)
                         for b in (_branch(block, v, state, stop, state_in, pos) for v in inner)]
    adds.sort(key=lambda a: pos[id(a)])
    fused = root.has(AddNorm)
    post = None if fused else _post_norm(block, root.result)
    if post is not None and post.result not in stop:
        post = None
    fused_post = fused and not block.users.get(root.residual)  # type: ignore[attr-defined]
    return Sublayer(root, tuple(adds), state, shortcut, shortcut_ops, tuple(branches), post, fused_post, tuple(leaves))


def decompose(block: Block) -> Wrapper:
    """The residual sublayers of ``block``, uncached (``structure.wrapper`` caches it per block)."""
    start = state_input(block)
    chain = spine(block, start)
    fused = [block.producers.get(v) for v in chain]
    stop = frozenset(chain) | {op.result for op in block.inputs} \
        | {r for op in fused if has(op, AddNorm) for r in op.results}  # type: ignore[union-attr]
    pos = {id(op): i for i, op in enumerate(block.ops)}
    subs: list[Sublayer] = []
    for prev, value in zip(chain, chain[1:]):
        op = block.producers.get(value)
        if has(op, ResidualSum):
            subs.append(_sublayer(block, op, prev, stop, start, pos))  # type: ignore[arg-type]
    return Wrapper(start, chain, tuple(subs))
