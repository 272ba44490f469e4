"""Cumulative shortcut weights across a stack, and the Jacobian route view.

Unrolling ``x_{i+1} = a_i x_i + F_i(...)`` over the updates of a stack gives
the output ``x_L = (∏_j a_j) x_0 + Σ_i (∏_{j>i} a_j) F_i``: the update ``i``
reaches the output scaled by the product of the shortcut weights of every
later update. This module lists the updates of each stack a block owns, in
stream order and layer by layer (each layer's constants evaluated at its own
index), with that product.

A shortcut weight is a constant only when the shortcut is the state times
numbers (DeepNorm's α, DeepScaleLM's λ, ``alpha * x``). A learned or gated
shortcut, nGPT's interpolation (the state keeps ``1 - α`` of a learned α), a
projection, a norm or dropout on the shortcut, and an update without a
shortcut have no constant weight: from there on the product is ``None``.
ReZero and LayerScale keep the shortcut at weight 1 and scale the branch
instead; the branch's initial multiplier is reported beside it
(``branch_init``: 0 for ReZero, CaiT's ε for LayerScale), never folded into
the product, since it multiplies the update and not the stream.

The route view: the stream after update ``i`` reaches the stack's output by
an identity route (a Jacobian term ``(∏_{j>i} a_j) I``) when every later
update keeps a constant shortcut and no norm sits on the stream from update
``i`` on (a Post-LN norm on a sum puts its own Jacobian on every route). A
final norm after the stack is named, since it lies on every route to the
model's output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from blockir.analyses.sizes import Env, Sizes, program_env, reads_layer
from blockir.analyses.structure import Sublayer, decl_kind, interpolation, normalized_shortcut, wrapper
from blockir.analyses.summaries import callee
from blockir.analyses.classify import final_norm
from blockir.ir.decls import KindDecl
from blockir.analyses.block_queries import has
from blockir.ir.traits import AddNorm, Calls, Product, Scales, Stochastic
from blockir.ir.program import Block, Program


@dataclass(frozen=True)
class Update:
    """One residual update of a stack, as the depth analysis sees it."""

    path: str  # layer prefix and the value the update writes: layers.3.h
    layer: int
    shortcut: str  # identity | constant | learned | gated | interpolation | projection | normalized | dropped | none
    weight: float | None  # the constant a_i, None when the shortcut has none
    branch_init: float | None  # the branches' initial multiplier: constants times learned gates' inits
    post_norm: str | None  # the norm on the sum (Post-LN), which breaks every route through it
    later: float | None = None  # ∏_{j>i} a_j
    identity_route: bool = False  # a route from the stream after this update to the stack output

    def data(self) -> dict[str, Any]:
        return {"update": self.path, "layer": self.layer, "shortcut": self.shortcut, "weight": self.weight,
                "branch_init": self.branch_init, "later_product": self.later,
                "identity_route": self.identity_route, **({"post_norm": self.post_norm} if self.post_norm else {})}


LISTED = 1024  # a stack of alike layers with more updates than this lists one layer's pattern


@dataclass(frozen=True)
class StackWeights:
    """The updates of one stack. When its layers are alike (the layer block does not read its index) only
    one layer's ``pattern`` is computed, so the analysis takes time independent of the depth; ``updates``
    unrolls it on demand."""

    stack: str  # the declaration of the stack in its owner
    block: str  # the layer block
    layers: int
    pattern: tuple[Update, ...]  # layer 0's updates (paths inside the layer), or every update when layers differ
    uniform: bool
    final_norm: str | None  # the owner's norm on the stack's output

    @cached_property
    def updates(self) -> tuple[Update, ...]:
        if not self.uniform:
            return _unrolled(list(self.pattern))
        return _unrolled([replace(u, path=f"{self.stack}.{i}.{u.path}", layer=i)
                          for i in range(self.layers) for u in self.pattern])

    @property
    def listed(self) -> bool:
        return not self.uniform or self.layers * len(self.pattern) <= LISTED

    def data(self) -> dict[str, Any]:
        head = {"stack": self.stack, "block": self.block, "layers": self.layers, "final_norm": self.final_norm}
        if self.listed:
            return head | {"updates": [u.data() for u in self.updates]}
        inner = _unrolled(list(self.pattern))
        return head | {"layer_product": _product(self.pattern), "layer_pattern": [u.data() for u in inner]}


def _shortcut(block: Block, s: Sublayer, scope: Sizes) -> tuple[str, float | None]:
    if s.shortcut is None:
        return "none", None
    if normalized_shortcut(block, s) is not None:
        return "normalized", None
    if interpolation(block, s) is not None:
        return "interpolation", None  # x + a * (t - x): the state keeps 1 - a of a learned a
    weight = 1.0
    if has(s.root, AddNorm) and s.root.shortcut_factor is not None:
        weight *= float(scope.value(s.root.shortcut_factor))
    for op in s.shortcut_ops:
        if has(op, Scales) and op.param is not None:
            return "learned", None
        if has(op, Product):
            return "gated", None
        if has(op, Stochastic) and scope.known(op.p) != 0:
            return "dropped", None
        if has(op, Calls) and decl_kind(block, op) == "linear":
            return "projection", None
        if has(op, Scales):
            weight *= float(scope.value(op.factor))  # type: ignore[arg-type]
    return ("identity" if weight == 1.0 else "constant"), weight


def _branch_init(block: Block, s: Sublayer, scope: Sizes) -> float | None:
    """The multiplier every branch of ``s`` starts with; None when the branches start differently."""
    inits = set()
    for b in s.branches:
        m = 1.0
        for op in b.scales:
            if op.factor is not None:
                m *= float(scope.value(op.factor))
            else:
                decl = block.decl_map.get(op.param or "")
                if not isinstance(decl, KindDecl) or decl.arg("init") is None:
                    return None
                m *= float(scope.value(decl.arg("init"))) + decl.arg("offset", 0)
        inits.add(m)
    return inits.pop() if len(inits) == 1 else None


def _updates(program: Program, block: Block, scope: Sizes, prefix: str, layer: int, out: list[Update]) -> None:
    """The updates along ``block``'s stream in op order, through the blocks it calls on the stream."""
    w = wrapper(block)
    roots = {id(s.root): s for s in w.sublayers}
    spine = w.spine_set
    for op in block.ops:
        s = roots.get(id(op))
        if s is not None:
            kind, weight = _shortcut(block, s, scope)
            post = s.post_norm.decl if s.post_norm is not None else \
                (s.root.decl if has(s.root, AddNorm) and s.fused_post else None)
            out.append(Update(prefix + s.result, layer, kind, weight, _branch_init(block, s, scope), post))
            continue
        d = callee(program, block, op)
        if d is None or not set(op.results) & spine:
            continue
        inner = program.block(d.block)
        if d.count is None:
            _updates(program, inner, scope.for_block(inner), f"{prefix}{d.name}.", layer, out)
        else:
            n = int(scope.value(d.count))
            for i in range(n):
                _updates(program, inner, scope.for_block(inner, i, n), f"{prefix}{d.name}.{i}.", i, out)


def _unrolled(updates: list[Update]) -> tuple[Update, ...]:
    """Each update with the product of later weights and its route, computed from the output back."""
    out: list[Update] = []
    product: float | None = 1.0
    route = True
    for u in reversed(updates):
        # the stream after u is the post-norm's output when there is one, so u's own norm is not on the route
        out.append(Update(u.path, u.layer, u.shortcut, u.weight, u.branch_init, u.post_norm, product, route))
        product = None if product is None or u.weight is None else product * u.weight
        route = route and u.weight is not None and u.post_norm is None
    return tuple(reversed(out))


def _product(updates: tuple[Update, ...]) -> float | None:
    """The product of the weights of ``updates`` (one layer's ∏ a_j), None when one has no constant weight."""
    p: float | None = 1.0
    for u in updates:
        p = None if p is None or u.weight is None else p * u.weight
    return p


def _power(base: float, exponent: int) -> float:
    try:
        return base ** exponent
    except OverflowError:  # as a running product does, the magnitude goes to infinity
        return math.copysign(math.inf, base) if exponent % 2 else math.inf


def stack_weights(program: Program, block: Block, env: Env | None = None) -> tuple[StackWeights, ...]:
    """The cumulative shortcut weights of every stack ``block`` applies, in declaration order."""
    scope = Sizes(program_env(program) if env is None else env, program.filename).for_block(block)
    fn = final_norm(block)
    out = []
    for op in block.ops:
        d = callee(program, block, op)
        if d is None or d.count is None:
            continue
        inner = program.block(d.block)
        n = int(scope.value(d.count))
        updates: list[Update] = []
        uniform = not reads_layer(inner)
        for i in range(1 if uniform else n):
            _updates(program, inner, scope.for_block(inner, i, n), "" if uniform else f"{d.name}.{i}.", i, updates)
        closing = fn.decl if fn is not None and fn.operand in op.results else None  # type: ignore[union-attr]
        out.append(StackWeights(d.name, inner.name, n, tuple(updates), uniform, closing))
    return tuple(out)


def route_summary(stack: StackWeights) -> dict[str, Any]:
    """How many depths have an identity route, and the smallest and largest later product; from one layer's
    pattern for a long stack of alike layers (layer i's products are the pattern's times P^(L-1-i))."""
    if stack.listed:
        products = [u.later for u in stack.updates if u.later is not None]
        routes, count = sum(u.identity_route for u in stack.updates), len(stack.updates)
    else:
        inner, p, n = _unrolled(list(stack.pattern)), _product(stack.pattern), stack.layers
        whole = p is not None and all(u.post_norm is None for u in stack.pattern)
        own = sum(u.identity_route for u in inner)
        routes, count = own + (n - 1) * own * whole, n * len(inner)
        # a power of P is monotonic in the exponent when P >= 0; a negative P alternates, so take two exponents
        exponents = [0] + ([] if p is None else [n - 1] + ([n - 2] if p < 0 and n > 2 else []))
        products = [u.later * _power(p, e) if e else u.later for u in inner if u.later is not None  # type: ignore[operator]
                    for e in exponents]
    return {"updates": count, "identity_routes": routes,
            "later_product_min": min(products) if products else None,
            "later_product_max": max(products) if products else None}


def describe(stack: StackWeights) -> str:
    """One line: the range of the later products and how many depths reach the output by an identity route."""
    r = route_summary(stack)
    weights = f"from {r['later_product_max']:.6g} to {r['later_product_min']:.6g}" \
        if r["later_product_min"] is not None else "none constant"
    posts = sorted({u.post_norm for u in stack.updates if u.post_norm is not None})
    broken = f" (norms on the stream: {', '.join(posts)})" if posts else ""
    norm = f"; final norm '{stack.final_norm}' on every route to the output" if stack.final_norm else ""
    return (f"shortcut weights of '{stack.stack}' ({stack.layers} × {stack.block}, {r['updates']} updates): later "
            f"products {weights}; identity route from {r['identity_routes']} of {r['updates']} depths{broken}{norm}")
