"""Shortcuts: every residual update carries its state forward once, unscaled and undropped.

The shortcut of ``x + u`` is exact addition (He et al., 2016); across a stack
the direct route is scaled by the product of the shortcut factors, so a
constant on it grows or shrinks the state exponentially with depth unless a
recipe sets it on purpose (DeepNorm's alpha, Wang et al., 2022; DeepScaleLM's
lambda, Kedia et al., 2024). The state added twice (``x + x + f(x)``, or a
branch that already returns ``x + f(x)``) doubles that route in every layer,
as a shortcut added once per tensor-parallel rank does. An update that
returns ``f(n(x))`` has no shortcut at all: it replaces the state. Each is
seen through calls: a helper block on the shortcut (its dropout drops the
identity path, its constant scales it), a branch that is a residual block, a
block on the stream or a stack whose layers replace their input.
"""
from __future__ import annotations

import math
from typing import Iterator, Mapping

from blockir.analyses.calls import Declared
from blockir.analyses.carry import Route, replacing, route, shortcut_route
from blockir.analyses.facts import stated
from blockir.analyses.sizes import block_env, enclosing_stacks, layer_counts, program_env, value
from blockir.analyses.structure import Sublayer, Wrapper, describe, wrapper
from blockir.analyses.summaries import Summaries, callee, summaries
from blockir.diagnostics import Diagnostic, Note, Span, error, warning
from blockir.ir.decls import InstanceDecl
from blockir.ir.traits import Calls, Modifier, Normalizes
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.verifiers.deepnorm import alpha_values
from blockir.verifiers.registry import verifier

DROP_HINT = "drop the branch update, not the state: {state} + dropout(branch(…), p=…)"
SCALE_HINT = ("add the state unscaled (x + f(x)) and scale the branch instead (x + a * f(x)); a recipe that scales "
              "the shortcut states it: DeepNorm's alpha in a Post-LN sum, `const deepscalelm = 1`, or "
              "`const scaled_shortcut = 1` for another deliberate constant")


def _same_type(block: Block, a: str, b: str) -> bool:
    return block.type_of(a).names == block.type_of(b).names


def _join(block: Block, s: Sublayer, leaf: str) -> Op:
    """The add of the sum tree that takes ``leaf``, where a diagnostic about it points."""
    return next((a for a in s.adds if leaf in a.operands), s.root)


def _residual_branch(program: Program, block: Block, leaf: str, state: str, env: Mapping,
                     facts: Summaries) -> tuple[Op, InstanceDecl, Span] | None:
    """A branch that calls a block returning its input plus updates on the state itself: (the call, the block,
    its first add)."""
    op = block.producers.get(leaf)
    while op is not None and op.has(Modifier):
        op = block.producers.get(op.operands[0])
    d = callee(program, block, op)
    if op is None or not op.has(Calls) or d is None or d.count is not None or not op.args:
        return None
    first = facts[d.block].identity_route
    if first is None or route(program, block, op.args[0], state, env, facts) is None:
        return None
    return op, d, first


def _counted_twice(program: Program, block: Block, s: Sublayer, keep: int, env: Mapping,
                   facts: Summaries) -> Iterator[Diagnostic]:
    state = describe(block, s.state)
    for j, leaf in enumerate(s.leaves):
        if j == keep:
            continue
        if route(program, block, leaf, s.state, env, facts) is not None:
            first, again = describe(block, s.leaves[keep]), describe(block, leaf)
            how = f" (as {first} and as {again})" if first != again else ""
            yield error("E0446", f"the shortcut is counted twice: the state {state} enters this residual sum twice"
                        f"{how}", _join(block, s, leaf).span,
                        notes=[Note("the residual add", s.root.span)],
                        hint=f"add the state once: {s.state} + f(…); a doubled shortcut doubles the direct route "
                             "across every layer")
            continue
        found = _residual_branch(program, block, leaf, s.state, env, facts)
        if found is None:
            continue
        call, d, inner = found
        yield error("E0446", f"the shortcut is counted twice: the branch '{call.decl}' ({d.block}) already returns "
                    f"its input {state} plus its own update, and this add adds {state} again", call.span,
                    notes=[Note(f"'{d.block}' adds its input to its update here", inner),
                           Note("the residual add", s.root.span)],
                    hint=f"a residual block is the whole update: write {call.decl}({s.state}) in place of "
                         f"{s.state} + {call.decl}({s.state}), or have it return only its branch")


def _declared(program: Program, block: Block, s: Sublayer, factor: float, env: Mapping,
              stacks: dict) -> bool:
    facts = stated(block, env)
    if any(name in facts and facts[name].value == 1 for name in ("deepscalelm", "scaled_shortcut")):
        return True
    post = s.post_norm is not None or s.fused_post
    return post and any(math.isclose(factor, a, rel_tol=1e-9) for a in alpha_values(program, block, stacks))


def _constant(program: Program, block: Block, s: Sublayer, r: Route, env: Mapping,
              stacks: dict) -> Iterator[Diagnostic]:
    factor, site = r.factor, r.scale
    if s.root.shortcut_scale() is not None:
        extra = value(s.root.shortcut_scale(), env)
        factor = None if factor is None or extra is None else factor * extra
        site = site or s.root.span
    if site is None or factor is None or math.isclose(factor, 1.0, rel_tol=1e-12):
        return
    if _declared(program, block, s, factor, env, stacks):
        return
    where, notes = "", [Note("the residual add", s.root.span)]
    if r.helper is not None:
        d = callee(program, block, r.helper)
        where, site = f" (through '{d.name}' ({d.block}))", r.helper.span  # type: ignore[union-attr]
        notes.insert(0, Note("scaled here", r.scale))  # type: ignore[arg-type]
    yield warning("W0403", f"the shortcut of this residual add is {describe(block, s.state)} times the constant "
                  f"{factor:.6g}{where}, and no recipe declares it: across a stack the direct route is scaled by "
                  "the product of these constants", site, notes=notes, hint=SCALE_HINT)


def _helper_dropout(program: Program, block: Block, s: Sublayer, r: Route) -> Iterator[Diagnostic]:
    if s.shortcut is not None or r.helper is None or r.dropout is None:
        return  # dropout among the block's own shortcut ops is the topology verifier's E0401
    d = callee(program, block, r.helper)
    yield error("E0401", f"dropout on the identity path: the shortcut {describe(block, s.state)} of this residual add "
                f"passes through '{d.name}' ({d.block}), which drops it", r.helper.span,  # type: ignore[union-attr]
                notes=[Note("dropped here", r.dropout), Note("the residual add", s.root.span)],
                hint=DROP_HINT.format(state=s.state))


def _updates(program: Program, block: Block, w: Wrapper, env: Mapping, facts: Summaries,
             stacks: dict) -> Iterator[Diagnostic]:
    for s in w.sublayers:
        found = shortcut_route(program, block, s, env, facts)
        if found is None and s.shortcut is None:
            if _same_type(block, s.state, s.root.results[0]):
                yield error("E0447", f"this residual add has no shortcut: none of its operands carries the state "
                            f"{describe(block, s.state)} forward, so the update replaces the state", s.root.span,
                            hint=f"add the updates to the state they read: {s.state} + f(…)")
            continue
        keep = s.leaves.index(found[0] if found is not None else s.shortcut)  # type: ignore[arg-type]
        yield from _counted_twice(program, block, s, keep, env, facts)
        if found is not None:
            yield from _constant(program, block, s, found[1], env, stacks)
            yield from _helper_dropout(program, block, s, found[1])


def _replacing_call(program: Program, block: Block, op: Op | None, facts: Summaries,
                    stacked: bool) -> tuple[InstanceDecl, Declared] | None:
    """A call (of a stack, or of one instance) of a block that replaces its input, and where it does."""
    d = callee(program, block, op)
    inner = facts[d.block].replaces_state if d is not None and (d.count is not None) == stacked else None
    return (d, inner) if d is not None and inner is not None else None


def _replaced(program: Program, block: Block, w: Wrapper, facts: Summaries) -> Iterator[Diagnostic]:
    """Computations on the stream of a residual layer that no update carries the state past."""
    residual = block.kind == "block" and facts[block.name].carries  # a model's head and embedding are not layers
    state = w.spine[0] if w.spine else ""
    for v in w.spine[1:] if residual else ():
        op = block.producers[v]
        called = _replacing_call(program, block, op, facts, stacked=False)
        if replacing(block, op):
            name = getattr(op, "decl", None) or getattr(op, "fn", "")
            yield error("E0447", f"'{name}' replaces the residual state {describe(block, state)}: no shortcut "
                        "carries the state past it, so this update has none", op.span,
                        hint=f"add the update to the state it reads: {state} + {name}(…)")
        elif called is not None:
            d, inner = called
            yield error("E0447", f"'{d.name}' ({d.block}) computes its result from the residual state "
                        f"{describe(block, state)} with no update carrying the state past it: on the stream, it "
                        "replaces the state", op.span, notes=[Note(f"'{d.block}' replaces its input here", inner.span)],
                        hint=f"give '{d.block}' a shortcut (x + f(…)), or call it as a branch: {state} + {d.name}(…)")
        if not (op.has(Modifier) or op.has(Normalizes) and v == op.result):
            state = v  # a norm, cast, scale or dropout of the state is a view of it, not the next state


def _stacks(program: Program, block: Block, facts: Summaries) -> Iterator[Diagnostic]:
    for op in block.ops:
        called = _replacing_call(program, block, op, facts, stacked=True)
        if called is None:
            continue
        d, inner = called
        yield error("E0447", f"each layer of '{d.name}' ({d.block}) replaces its input: no update of '{d.block}' "
                    "carries the residual state forward, so the stack has no shortcut", op.span,
                    notes=[Note(f"'{d.block}' replaces its input here", inner.span)],
                    hint=f"add each update to the state it reads in '{d.block}': x + f(norm(x))")


@verifier("shortcuts")
def verify_shortcuts(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    counts = layer_counts(program, base)
    stacks = enclosing_stacks(program, base)
    facts = summaries(program)
    out: list[Diagnostic] = []
    for block in program.blocks:
        env = block_env(base, block, 0, counts.get(block.name, (1,))[0])
        w = wrapper(block)
        out += _updates(program, block, w, env, facts, stacks)
        out += _replaced(program, block, w, facts)
        out += _stacks(program, block, facts)
    return out
