"""The residual wrapper of a block: which value is the state, where it is updated, by what.

Every verifier that reasons about topology (placement, dropout position,
shortcut scaling, in-place writes, folding) needs the same decomposition of a
block into *sublayers*: one residual add (possibly a tree of adds joining
several branches) plus the norms around it. This module computes it once from
the op graph:

* the **state input** is the input whose axes equal the block's result axes;
* the **spine** is the chain of ops every path from the state input to the
  output passes through (immediate dominators); the stream values live there;
* each add on the spine is a sublayer root; its operand leaves split into the
  **shortcut** (the leaf reached from the previous stream value through
  scales, dropouts, casts and gate products, else a projection, else a norm)
  and the **branches**;
* a **gate** is a product ``z * v`` whose factor ``z`` is a sigmoid, tanh or
  erf of something, or ``1 - z`` of one: a gated residual
  ``z * x + (1 - z) * u`` is one update whose shortcut and branch are gated;
* a norm whose only input is the sum is the sublayer's post-norm (Post-LN);
* an update ``alpha * (t - x)`` that steps from the state toward a target is an
  **interpolation** (nGPT's ``unit(x + alpha * (unit(f(x)) - x))``): the branch
  computes ``t``, and the state it subtracts is not a second shortcut.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import networkx as nx

from blockir.analyses.cache import per_object
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.kinds import GATES
from blockir.ops import ActivationOp, AddOp, CallOp, CastOp, ComplementOp, DropoutOp, FusedAddNormOp, InputOp, MulOp, NormOp, Op, OutputOp, ScaleOp, SubOp
from blockir.ir.program import Block
from blockir.norms import FAMILIES

MODIFIERS = (ScaleOp, DropoutOp, CastOp)
ROOTS = (AddOp, FusedAddNormOp)
GATE_FUNCTIONS = (*GATES, "tanh")  # bounded squashing functions whose output gates a value


@dataclass(frozen=True)
class Branch:
    """One update joining a residual add: everything between the stream and the add."""

    leaf: str  # the operand of the add it produces
    ops: tuple[Op, ...]  # its ops, in program order
    call: Op | None  # the principal computation (attention, MLP, extern, …)
    kind: str  # causal_self_attention, cross_attention, mlp, gated_mlp, linear, extern, block, …
    pre_norms: tuple[NormOp | FusedAddNormOp, ...]  # norms (or fused add+norms) the branch reads the stream through
    out_norm: NormOp | None  # norm on the branch output before the add
    modifiers: tuple[Op, ...]  # scales, dropouts and casts between the computation and the add, add-side first
    memory: tuple[str, ...]  # non-state block inputs it reads

    @property
    def name(self) -> str:
        return getattr(self.call, "decl", None) or getattr(self.call, "fn", None) or self.leaf

    @property
    def label(self) -> str:
        """The kind, naming the declaration when the kind alone says little (externs, blocks)."""
        return f"{self.kind}:{self.name}" if self.kind in ("extern", "block", "stack") else self.kind

    @property
    def scales(self) -> tuple[ScaleOp, ...]:
        return tuple(op for op in self.modifiers if isinstance(op, ScaleOp))

    @property
    def dropouts(self) -> tuple[DropoutOp, ...]:
        return tuple(op for op in self.modifiers if isinstance(op, DropoutOp))

    @property
    def gates(self) -> tuple[MulOp, ...]:
        """Gate products between the computation and the add."""
        return tuple(op for op in self.modifiers if isinstance(op, MulOp))


@dataclass(frozen=True)
class Sublayer:
    """One residual update of the stream: ``state → (shortcut, branches) → add [→ post-norm]``."""

    root: AddOp | FusedAddNormOp
    adds: tuple[AddOp, ...]  # the whole sum tree, root last
    state: str  # the stream value the update starts from
    shortcut: str | None  # the add operand carrying the shortcut
    shortcut_ops: tuple[Op, ...]  # ops from the state to the shortcut operand, in program order
    branches: tuple[Branch, ...]
    post_norm: NormOp | None
    fused_post: bool = False  # a fused root whose normalized output continues the stream (Post-LN)
    leaves: tuple[str, ...] = ()  # the operands of the sum tree: the shortcut and the update operands

    @property
    def updates(self) -> tuple[str, ...]:
        """The add operands that make the update u (their sum), the shortcut excluded."""
        return tuple(v for v in self.leaves if v != self.shortcut)

    @property
    def result(self) -> str:
        """The stream value after this update."""
        if self.post_norm is not None:
            return self.post_norm.result
        if isinstance(self.root, FusedAddNormOp):
            return self.root.normalized if self.fused_post else self.root.residual
        return self.root.result

    @property
    def shortcut_gates(self) -> tuple[MulOp, ...]:
        """Gate products on the shortcut (the ``z * x`` of a gated residual)."""
        return tuple(op for op in self.shortcut_ops if isinstance(op, MulOp))

    @property
    def shortcut_scaled(self) -> bool:
        """Whether a constant multiplies the shortcut (DeepNorm's alpha), fused or not."""
        return any(isinstance(op, ScaleOp) and op.factor is not None for op in self.shortcut_ops) \
            or isinstance(self.root, FusedAddNormOp) and self.root.shortcut_factor is not None

    @property
    def placement(self) -> str:
        """Where this update normalizes: any of pre, out, post joined by '+', or 'none'."""
        parts = [name for name, present in (
            ("pre", any(b.pre_norms for b in self.branches)),
            ("out", any(b.out_norm is not None for b in self.branches)),
            ("post", self.post_norm is not None or self.fused_post)) if present]
        return "+".join(parts) or "none"


@dataclass(frozen=True)
class Wrapper:
    state_input: str | None
    spine: tuple[str, ...]  # stream values from the state input to the returned value
    sublayers: tuple[Sublayer, ...]

    @cached_property
    def spine_set(self) -> frozenset[str]:
        return frozenset(self.spine)

    @cached_property
    def norm_sites(self) -> dict[str, str]:
        """Norm result → where it sits in its update: pre, out or post."""
        out: dict[str, str] = {}
        for sub in self.sublayers:
            for b in sub.branches:
                for n in b.pre_norms:
                    out[n.result] = "pre"
                if b.out_norm is not None:
                    out[b.out_norm.result] = "out"
            if sub.post_norm is not None:
                out[sub.post_norm.result] = "post"
            if isinstance(sub.root, FusedAddNormOp):
                out[sub.root.normalized] = "post" if sub.fused_post else "pre"
        return out


def decl_kind(block: Block, op: Op) -> str | None:
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if isinstance(decl, KindDecl):
        return decl.kind
    if isinstance(decl, ExternDecl):
        return "extern"
    if isinstance(decl, InstanceDecl):
        return decl.kind  # block | stack
    return None


def is_linear(block: Block, op: Op) -> bool:
    return isinstance(op, CallOp) and decl_kind(block, op) == "linear"


def state_input(block: Block) -> str | None:
    """The input that carries the residual state: the first whose axes equal the result's."""
    inputs = block.inputs
    for op in inputs:
        if op.type.names == block.result.names:
            return op.result
    return inputs[0].result if inputs else None


def _gate_rank(block: Block, value: str) -> int:
    """How surely ``value`` is a gate: 2 for a sigmoid or a complement ``1 - z`` (values in [0, 1]),
    1 for tanh or erf (they also squash a candidate update, as in a GRU), 0 for anything else."""
    op = block.producers.get(value)
    if isinstance(op, ComplementOp):
        return 2 if _gate_rank(block, op.operand) else 0
    fn = op.fn if isinstance(op, ActivationOp) else None
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if isinstance(decl, KindDecl) and decl.kind == "activation":
        fn = decl.arg("fn")
    return 2 if fn == "sigmoid" else 1 if fn in GATE_FUNCTIONS else 0


def is_gate(block: Block, value: str) -> bool:
    """Whether ``value`` is a gate: a sigmoid, tanh or erf of something, or one minus a gate."""
    return _gate_rank(block, value) > 0


def gated(block: Block, op: Op | None) -> tuple[str, str] | None:
    """(the gate, the gated value) of a gate product ``z * v``, or None for any other op.

    When both factors could gate, the one surer to lie in [0, 1] is the gate; a tie is no gate.
    """
    if not isinstance(op, MulOp):
        return None
    lhs, rhs = _gate_rank(block, op.lhs), _gate_rank(block, op.rhs)
    if lhs > rhs:
        return op.lhs, op.rhs
    if rhs > lhs:
        return op.rhs, op.lhs
    return None


def _stream_value(block: Block, op: Op) -> str:
    if isinstance(op, FusedAddNormOp):
        # a fused op continues the stream through its residual unless only the normalized value is read
        return op.residual if block.users.get(op.residual) else op.normalized
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
    out = next((i for i, op in enumerate(ops) if isinstance(op, OutputOp)), None)
    first = next((i for i, op in enumerate(ops) if isinstance(op, InputOp) and op.result == start), None)
    if out is None or first is None:
        return ()
    # carried streams (a score route, a second residual stream) run beside the hidden state, not on it
    carried = frozenset(r for op in ops if isinstance(op, CallOp) for r in op.more)
    idom = nx.immediate_dominators(op_graph(block, carried), first)  # covers the ops reachable from the state
    returned = ops[out]
    if returned.more:  # carried streams leave through the output too: the stream ends at the hidden value
        out = next(i for i, op in enumerate(ops) if returned.value in op.results)
    if out not in idom:
        return (start,)  # the output does not depend on the state
    chain, node = [], out if returned.more else idom[out]
    while True:
        chain.append(node)
        if node == first:
            break
        node = idom[node]
    return tuple(_stream_value(block, ops[i]) for i in reversed(chain))


def _sum_tree(block: Block, root: AddOp | FusedAddNormOp, on_spine: frozenset[str],
              pos: dict[int, int]) -> tuple[list[AddOp], list[str]]:
    """The adds folded into ``root`` (single-use adds off the spine) and its leaf operands. A fused add+norm
    sums its shortcut and branch operands, so a partial sum feeding it (a parallel block's first update)
    unfolds the same way as under a plain add."""
    adds: list[AddOp] = []
    leaves: list[str] = []

    def operands(values: tuple[str, ...]) -> None:
        for v in values:
            prod = block.producers.get(v)
            if isinstance(prod, AddOp) and v not in on_spine and len(block.users.get(v, ())) == 1:
                adds.append(prod)
                operands(prod.operands)
            else:
                leaves.append(v)

    if isinstance(root, FusedAddNormOp):
        operands((root.shortcut, root.branch))
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
        if isinstance(op, FusedAddNormOp) and v == op.normalized and op.residual == state:
            path.append(op)  # the normalized output of the add that made the state
            break
        gate = gated(block, op)
        if gate is not None:
            path.append(op)
            v = gate[1]
            continue
        if not (isinstance(op, (*MODIFIERS, NormOp)) or is_linear(block, op)):
            return None
        path.append(op)
        v = op.operands[0]
    return tuple(reversed(path))


def _cost(block: Block, path: tuple[Op, ...]) -> tuple[int, int, int]:
    # the identity (or a scaled or dropped state) beats a projection, which beats a normalized state
    return (sum(isinstance(op, (NormOp, FusedAddNormOp)) for op in path), sum(is_linear(block, op) for op in path),
            len(path))


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
        if op is None or isinstance(op, InputOp) or v in getattr(op, "more", ()):
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
        if kind in ("self_attention", "cross_attention", "mlp", "gated_mlp", "extern", "block", "stack"):
            if kind == "self_attention":
                decl = block.decl_map.get(getattr(op, "decl", ""))
                causal = isinstance(decl, KindDecl) and decl.arg("causal")
                return op, "causal_self_attention" if causal else "self_attention"
            return op, kind
    linears = [op for op in ops if is_linear(block, op)]
    acts = [op for op in ops if isinstance(op, ActivationOp) or decl_kind(block, op) == "activation"]
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
        if isinstance(op, SubOp) and op.rhs == state:
            v = op.lhs  # an interpolation's step: the branch proposes its minuend, the state is not a branch
            continue
        if isinstance(op, MODIFIERS):
            modifiers.append(op)
        elif isinstance(op, NormOp) and out_norm is None and v not in stop and op.operand not in stop:
            out_norm = op
        else:
            break
        v = op.operands[0]
    core = v  # the value the modifiers and gates wrap
    pre: list[NormOp | FusedAddNormOp] = [op for op in ops if isinstance(op, NormOp) and op.operand in stop
                                          and op is not out_norm]
    for v in {v for op in ops for v in op.operands} | {leaf}:
        fused = block.producers.get(v)
        # reading a fused op's normalized output, when that is not the stream itself, is a pre-norm
        if isinstance(fused, FusedAddNormOp) and v == fused.normalized and v != state and fused not in pre:
            pre.append(fused)
    # what the branch computes is what its gates pass, not what computes the gates
    call, kind = branch_kind(block, _closure(block, core, stop, pos) if core != leaf else ops)
    reads = {v for op in ops for v in op.operands} | {leaf}
    memory = tuple(op.result for op in block.inputs if op.result in reads and op.result != state_in)
    return Branch(leaf, tuple(ops), call, kind, tuple(pre), out_norm, tuple(modifiers), memory)


def _shared_modifiers(block: Block, leaf: str, stop: frozenset[str],
                      pos: dict[int, int]) -> tuple[list[str], tuple[Op, ...], list[AddOp]]:
    """Split ``leaf`` when modifiers wrap a sum of branches: ``x + dropout(mlp(n) + attn(n))``.

    Returns the branch leaves, the modifiers they share (add-side first) and
    the inner adds; a leaf that is not such a sum comes back alone.
    """
    outer: list[Op] = []
    v = leaf
    op = block.producers.get(v)
    while isinstance(op, MODIFIERS) and len(block.users.get(v, ())) == 1:
        outer.append(op)
        v = op.operands[0]
        op = block.producers.get(v)
    if outer and isinstance(op, AddOp) and v not in stop and len(block.users.get(v, ())) == 1:
        joins, inner = _sum_tree(block, op, stop, pos)
        return inner, tuple(outer), joins
    return [leaf], (), []


def _post_norm(block: Block, value: str) -> NormOp | None:
    users = block.users.get(value, ())
    return users[0] if len(users) == 1 and isinstance(users[0], NormOp) else None


def _sublayer(block: Block, root: AddOp | FusedAddNormOp, state: str, stop: frozenset[str],
              state_in: str | None, pos: dict[int, int]) -> Sublayer:
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
    post = None if isinstance(root, FusedAddNormOp) else _post_norm(block, root.result)
    if post is not None and post.result not in stop:
        post = None
    fused_post = isinstance(root, FusedAddNormOp) and not block.users.get(root.residual)
    return Sublayer(root, tuple(adds), state, shortcut, shortcut_ops, tuple(branches), post, fused_post, tuple(leaves))


@per_object
def wrapper(block: Block) -> Wrapper:
    """Decompose ``block`` into its residual sublayers (see the module docstring); cached per block object."""
    return _decompose(block)


def _decompose(block: Block) -> Wrapper:
    start = state_input(block)
    chain = spine(block, start)
    fused = [block.producers.get(v) for v in chain]
    stop = frozenset(chain) | {op.result for op in block.inputs} \
        | {r for op in fused if isinstance(op, FusedAddNormOp) for r in op.results}
    pos = {id(op): i for i, op in enumerate(block.ops)}
    subs: list[Sublayer] = []
    for prev, value in zip(chain, chain[1:]):
        op = block.producers.get(value)
        if isinstance(op, ROOTS):
            subs.append(_sublayer(block, op, prev, stop, start, pos))
    return Wrapper(start, chain, tuple(subs))


def describe(block: Block, value: str) -> str:
    """How a diagnostic names a value: its own name, or the expression that made a temporary."""
    if not value.startswith("%"):
        return f"'{value}'"
    op = block.producers.get(value)
    return op.label() if op is not None else f"'{value}'"


def ancestors(block: Block, value: str) -> set[str]:
    """Every value ``value`` is computed from, itself included."""
    seen: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        op = block.producers.get(v)
        if op is not None:
            stack += op.operands
    return seen


def embedded(block: Block, v: str) -> bool:
    """Whether ``v`` is where the stream begins: an embedding lookup, or a sum of lookups (token, position and
    type tables), seen through casts, dropout and scales."""
    todo, seen = [v], set()
    while todo:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        op = block.producers.get(u)
        if isinstance(op, (CastOp, DropoutOp, ScaleOp)):
            todo.append(op.operands[0])
        elif isinstance(op, AddOp):
            todo += op.operands
        elif not (isinstance(op, CallOp) and decl_kind(block, op) == "embedding"):
            return False
    return True


def stream_norm(block: Block, op: Op | None) -> bool:
    """Whether ``op`` normalizes the stream, as opposed to starting it: a norm of embedding lookups (BLOOM's
    ``word_embeddings_layernorm``, BERT's embedding LayerNorm) is where the stream begins normalized."""
    if isinstance(op, NormOp):
        return not embedded(block, op.operand)
    return isinstance(op, FusedAddNormOp)


def normalized_shortcut(block: Block, sub: Sublayer) -> NormOp | FusedAddNormOp | None:
    """The norm whose output this update uses as its shortcut, when the stream continues from a normalized value.

    Either the shortcut path passes through a norm, or the update starts from
    a norm's output without normalizing its own sum (so it is not Post-LN).
    """
    norm = next((op for op in sub.shortcut_ops if stream_norm(block, op)), None)
    if norm is not None:
        return norm  # type: ignore[return-value]
    start = block.producers.get(sub.state)
    if isinstance(start, NormOp) and stream_norm(block, start) and sub.post_norm is None \
            and not isinstance(sub.root, FusedAddNormOp):
        return start
    return None


def interpolation(block: Block, sub: Sublayer) -> SubOp | None:
    """The difference ``t - state`` an update steps along, when its one update is scales of it (nGPT)."""
    if len(sub.updates) != 1:
        return None
    op = block.producers.get(sub.updates[0])
    while isinstance(op, ScaleOp):
        op = block.producers.get(op.operand)
    return op if isinstance(op, SubOp) and op.rhs == sub.state else None


def retracted(block: Block, sub: Sublayer) -> bool:
    """Whether an update is nGPT's: an interpolation whose sum an ``l2norm`` brings back to unit length."""
    post = sub.post_norm
    return interpolation(block, sub) is not None and post is not None and \
        (kind := decl_kind(block, post)) in FAMILIES and FAMILIES[kind].unit_length
def attention_norms(block: Block) -> tuple[NormOp, ...]:
    """The norm applications whose output an attention branch reads (DyT's attention sites)."""
    return tuple(n for s in wrapper(block).sublayers for b in s.branches
                 if b.call is not None and decl_kind(block, b.call) in ("self_attention", "cross_attention")
                 for n in b.pre_norms if isinstance(n, NormOp))
