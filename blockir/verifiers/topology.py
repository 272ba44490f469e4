"""Topology: where dropout, shortcuts, cross-attention and final norms sit.

Branch dropout drops the update before the add, never the shortcut nor the
sum (Vaswani et al., 2017). A stack whose layers leave the stream unnormalized ends with
a norm (Xiong et al., 2020). Cross-attention belongs to the decoder of an encoder–decoder,
after masked self-attention and before the MLP (Vaswani et al., 2017); an output head
reads a normalized stream too. The shortcut is the identity: no projection or learned
gate on it (how often and how scaled it is added is the shortcuts verifier's). A fused
add+norm's normalized output is the branch input, its residual output the stream
(docs/fused.md).
"""
from __future__ import annotations

from typing import Iterator

from blockir.analyses.sizes import block_env, layer_counts, program_env, value
from blockir.analyses.facts import stated
from blockir.analyses.structure import (Wrapper, ancestors, decl_kind, describe, gated, is_linear,
                                        normalized_shortcut, stream_norm, wrapper)
from blockir.analyses.block_queries import embedded
from blockir.analyses.carry import head_source
from blockir.analyses.summaries import callee, called_blocks, memory_inputs, output_source, stream_items, summaries
from blockir.diagnostics import Diagnostic, Note, Span, error, warning
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.traits import Calls, DropsLayer, Modifier, Normalizes, Scales, Stochastic
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.analyses.classify import final_norm
from blockir.verifiers.registry import verifier

SELF = ("self_attention", "causal_self_attention")
MLPS = ("mlp", "gated_mlp", "moe")


def _p(op: Op, env: dict) -> float | int | None:
    """The drop probability of a stochastic op in ``env``."""
    return value(op.p, env)  # type: ignore[union-attr]


# --- dropout -----------------------------------------------------------------

def _dropouts(program: Program, block: Block, w: Wrapper, env: dict) -> Iterator[Diagnostic]:
    results = {s.result for s in w.sublayers} | {s.root.result for s in w.sublayers}
    for s in w.sublayers:
        for op in s.shortcut_ops:
            if op.has(Stochastic) and _p(op, env) != 0:
                yield error("E0401", f"dropout on the identity path: the shortcut {describe(block, s.state)} of this "
                            "residual add is dropped", op.span, notes=[Note("the residual add", s.root.span)],
                            hint=f"drop the branch update, not the state: {s.state} + dropout(branch(…), p=…)")
    # a block with no residual update of its own that others call is a helper: where it drops the stream,
    # its callers report it at the call
    helper = not w.sublayers and block.name in called_blocks(program)
    facts = summaries(program)
    for v in w.spine[1:]:
        op = block.producers.get(v)
        d = callee(program, block, op) if op is not None else None
        if d is not None and facts[d.block].drops_state and not helper:
            yield error("E0402", f"'{d.name}' ({d.block}) applies dropout to the residual state it is given, not to "
                        "a branch update", op.span, notes=[Note(f"'{d.block}' is defined here",
                                                                program.block(d.block).span)],
                        hint="apply it to the branch output before the add: x + d(branch(…))")
        # the lookups are where the stream begins, not a state an update was added to (GPT-2's embd_pdrop)
        if op is not None and op.has(Stochastic) and _p(op, env) != 0 and not helper and \
                not embedded(block, op.operand):
            what = "after the residual add drops the updated state" if op.operand in results \
                else f"on the residual state drops {describe(block, op.operand)} itself"
            yield error("E0402", f"dropout {what}, not a branch update", op.span,
                        hint="apply dropout to the branch output before the add: x + dropout(branch(…), p=…)")


def _layer_drops(block: Block, w: Wrapper, env: dict) -> Iterator[Diagnostic]:
    """One draw skips the whole layer, so it must remove every update and leave the state exactly as it came."""
    drops = [op for op in block.ops if op.has(DropsLayer) and _p(op, env) != 0]
    if not drops:
        return
    first = drops[0]
    hint = "a skipped layer returns its input: put layer_drop(…, p=P) with one P on every update, in a block " \
           "whose residual sums are not normalized"
    for op in drops[1:]:
        if _p(op, env) != _p(first, env):
            yield error("E0415", f"layer_drop with p={_p(op, env)} in a layer whose first layer_drop has "
                        f"p={_p(first, env)}: one draw decides the whole layer", op.span,
                        notes=[Note("the first layer_drop", first.span)], hint=hint)
    on_updates = {id(d) for s in w.sublayers for b in s.branches for d in b.dropouts}
    for op in drops:
        if id(op) not in on_updates and not any(op in s.shortcut_ops for s in w.sublayers):  # shortcut: E0401
            yield error("E0415", "layer_drop does not scale a whole residual update: a dropped layer would still "
                        "apply the rest of it", op.span, hint=hint)
    for s in w.sublayers:
        for b in s.branches:
            if not any(d.has(DropsLayer) for d in b.dropouts):
                yield error("E0415", f"the update {describe(block, b.leaf)} is not layer-dropped while "
                            f"{first.label()} is: a dropped layer would still apply it", s.root.span,
                            notes=[Note("layer-dropped here", first.span)], hint=hint)
        if s.post_norm is not None or s.fused_post:
            yield error("E0415", "this residual sum is normalized: a dropped layer would still normalize the state "
                        "instead of returning it", s.root.span, notes=[Note("layer-dropped here", first.span)],
                        hint=hint)


def _training(block: Block, env: dict) -> Iterator[Diagnostic]:
    fact = stated(block, env).get("training")
    if fact is None or fact.value != 0:
        return
    for op in block.ops:
        p = _p(op, env) if op.has(Stochastic) else 0
        if p:
            yield error("E0411", f"dropout with p={p} in '{block.name}', which states training = 0: an evaluated "
                        "block must be deterministic", op.span, notes=[Note("stated here", fact.const.span)],
                        hint="set p=0 or remove it; stochastic regularization belongs to the training graph")


# --- shortcuts -----------------------------------------------------------------

def _shortcuts(block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    for s in w.sublayers:
        for op in s.shortcut_ops:
            decl = block.decl_map.get(getattr(op, "decl", "") or "")
            if is_linear(block, op) and isinstance(decl, KindDecl) and decl.arg("in_dim") == decl.arg("out_dim"):
                yield error("E0409", f"the shortcut passes through the projection '{decl.name}' "
                            f"({decl.arg('in_dim')} -> {decl.arg('out_dim')}): the identity path no longer carries "
                            "the state unchanged", op.span, notes=[Note("the residual add", s.root.span)],
                            hint="a projection belongs on the shortcut only where the width or the row owner "
                                 "changes; move it into the branch or remove it")
            if op.has(Scales) and op.param is not None:
                kind = block.decl_map[op.param].kind if op.param in block.decl_map else "scale"
                yield warning("W0402", f"the shortcut is gated by the learned {kind} '{op.param}': the direct route "
                              "across this add is a trained scale, not the identity", op.span,
                              hint="gate the branch instead (ReZero, LayerScale: x + g * f(x)); a recipe's fixed "
                                   "shortcut constant (DeepNorm's alpha) is a constant, not a parameter")


def _gates(block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    """A gated shortcut needs gated updates: ``z * x + u`` lets the gate shrink the state while u adds in full."""
    for s in w.sublayers:
        if not s.shortcut_gates:
            continue
        for b in s.branches:
            if not b.gates:
                gate = s.shortcut_gates[0]
                yield error("E0414", f"the shortcut is gated by {describe(block, gated(block, gate)[0])} but the "
                            f"update {describe(block, b.leaf)} is not: the gate shrinks the state and the update "
                            "still adds in full", gate.span,
                            notes=[Note("the ungated update", block.producers[b.leaf].span)],
                            hint="gate both sides of the convex combination: z * x + (1 - z) * u")


def _normalized_shortcut(block: Block, w: Wrapper, env: dict) -> Iterator[Diagnostic]:
    fact = stated(block, env).get("residual_from_norm")
    if fact is not None and fact.value == 1:
        return  # stated on purpose; the classification verifier checks the statement holds
    for s in w.sublayers:
        norm = normalized_shortcut(block, s)
        if norm is None:
            continue
        shortcut = s.shortcut if norm in s.shortcut_ops else s.state
        yield error("E0412", f"the shortcut of this add is {describe(block, shortcut)}, the normalized output of "
                    f"'{norm.decl}': the residual stream continues from a normalized value", s.root.span,
                    notes=[Note("normalized here", norm.span)],
                    hint="add the update to the un-normalized state (Pre-LN: h + f(norm(h))) or normalize the sum "
                         "(Post-LN: norm(h + f(h))); a fused add+norm returns (normalized, residual) and the "
                         "residual is the stream; if the model is wired this way on purpose, state it with "
                         "`const residual_from_norm = 1`")


_HINT_0412 = ("add the update to the un-normalized state (Pre-LN: h + f(norm(h))) or normalize the sum "
              "(Post-LN: norm(h + f(h))); if the model is wired this way on purpose, state it with "
              "`const residual_from_norm = 1` in the block that continues the stream")


def _normalized_source(program: Program, block: Block, v: str) -> tuple[str, Span] | None:
    """Where ``v`` was normalized, looking through casts, dropout and scales: a norm of this block, or a
    call of a block (or stack) whose result is a norm's output."""
    op = block.producers.get(v)
    while op is not None and op.has(Modifier) and len(op.operands) == 1:
        v = op.operands[0]
        op = block.producers.get(v)
    # a fused add+norm's other result, the residual sum, is not normalized
    if op is not None and op.has(Normalizes) and v == op.result and stream_norm(block, op):
        return f"the normalized output of '{op.decl}'", op.span
    d = callee(program, block, op) if op is not None else None
    if d is not None and summaries(program)[d.block].ends_normalized:
        return f"the result of '{d.name}', which ends with a norm", op.span  # type: ignore[union-attr]
    return None


def _normalized_into_state(program: Program, block: Block, w: Wrapper, env: dict) -> Iterator[Diagnostic]:
    """E0412 through calls: an update of this block that continues the result of a block ending with a norm, a
    normalized value handed to a block that continues its input as the residual state, and a stack whose layers
    end normalized while each layer continues its input un-normalized."""
    fact = stated(block, env).get("residual_from_norm")
    for s in w.sublayers if fact is None or fact.value != 1 else ():
        if s.post_norm is not None or s.root.has(Normalizes) \
                or callee(program, block, block.producers.get(s.state)) is None:
            continue  # a norm of this block itself is the flat check's
        source = _normalized_source(program, block, s.state)
        if source is not None:
            what, span = source
            yield error("E0412", f"the shortcut of this add is {what}: the residual stream continues from a "
                        "normalized value", s.root.span, notes=[Note("normalized here", span)], hint=_HINT_0412)
    for op in block.ops:
        d = callee(program, block, op)
        if d is None:
            continue
        inner = summaries(program)[d.block]
        takes = inner.takes_state
        if takes is None:
            continue
        note = Note(f"'{d.block}' adds to its input here without normalizing the sum", takes.span)
        source = _normalized_source(program, block, op.args[0]) if op.args else None  # type: ignore[attr-defined]
        if source is not None:
            what, span = source
            yield error("E0412", f"'{d.name}' continues its first input as the residual stream, but is handed "
                        f"{what}: the stream continues from a normalized value", op.span,
                        notes=[Note("normalized here", span), note], hint=_HINT_0412)
        elif d.count is not None and inner.ends_normalized and (value(d.count, env) or 0) > 1:
            yield error("E0412", f"each layer of '{d.name}' returns a norm's output, and the next layer continues it "
                        "as the residual stream: the stream continues from a normalized value", op.span,
                        notes=[note], hint=_HINT_0412)


# --- stacks --------------------------------------------------------------------

def _unnormalized_member(program: Program, block: Block, op: Op | None) -> tuple[Op, Block] | None:
    """The called block whose un-normalized residual stream ``op`` returns, if any."""
    d = callee(program, block, op) if op is not None else None
    if d is None or not summaries(program)[d.block].unnormalized_stream:
        return None
    return op, program.block(d.block)  # type: ignore[return-value]


def _head_name(program: Program, block: Block, head: Op) -> str:
    d = callee(program, block, head)
    inner = summaries(program)[d.block].raw_head if d is not None else None
    return f"{d.name}.{inner.path}" if d is not None and inner is not None else head.decl  # type: ignore[attr-defined]


def _final_norm(program: Program, block: Block, env: dict) -> Iterator[Diagnostic]:
    """A model's output, or the input of the output head it applies (here or in a block it calls), is
    normalized when the stack it comes from leaves its residual sum unnormalized."""
    headed = head_source(program, block, summaries(program))
    if block.kind != "model" and headed is None or block.output is None:
        return
    fact = stated(block, env).get("final_norm")
    if headed is None:
        present = final_norm(block)
        needed = _unnormalized_member(program, block, output_source(block)[1])
    else:
        _, read, source = headed
        present = source if source is not None and source.has(Normalizes) and read == source.result else None
        needed = _unnormalized_member(program, block, source)
    if fact is not None and fact.valid:
        if fact.value == 0 and present is not None:
            yield error("E0407", f"'{block.name}' states final_norm = 0, but it returns the output of norm "
                        f"'{present.decl}'", present.span, notes=[Note("stated here", fact.const.span)],
                        hint="remove the final norm or the stated fact")
        if fact.value == 1 and present is None:
            yield error("E0407", f"'{block.name}' states final_norm = 1, but its output is not normalized",
                        block.output.span, notes=[Note("stated here", fact.const.span)],
                        hint="end the model with a norm: return norm(layers(x))")
        return
    if needed is None or present is not None:
        return
    call, member = needed
    decl = block.decl_map[call.decl]  # type: ignore[attr-defined]
    notes = [Note("the stack" if getattr(decl, "count", None) is not None else "the block returning the stack",
                  decl.span)]
    if headed is None:
        yield error("E0403", f"model '{block.name}' returns the output of '{call.decl}' ({member.name}) without a "  # type: ignore
                    f"final norm, but '{member.name}' leaves its last residual add unnormalized", block.output.span,
                    notes=notes, hint="end the model with a norm (return norm(layers(x))); if the output head "
                                      "applies it, state that with `const final_norm = 0`")
        return
    head = _head_name(program, block, headed[0])
    yield error("E0403", f"'{block.name}' applies its head '{head}' to the output of '{call.decl}' ({member.name}) "  # type: ignore
                f"without a final norm, but '{member.name}' leaves its last residual add unnormalized",
                block.output.span, notes=notes,
                hint=f"normalize what the head reads: {headed[0].decl}(norm({call.decl}(…))); if the head "  # type: ignore
                     "applies the norm itself, state that with `const final_norm = 0`")


# --- encoder–decoder -------------------------------------------------------------

def _cross_attention(program: Program, block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    memory = memory_inputs(block)
    facts = summaries(program)
    crosses = [op for op in block.ops if op.has(Calls) and decl_kind(block, op) == "cross_attention"]
    for op in crosses:
        # with the arguments swapped (queries from memory) the shape verifier reports E0206 instead
        if len(op.args) == 2 and not (ancestors(block, op.args[0]) | ancestors(block, op.args[1])) & memory:
            yield error("E0404", f"cross-attention '{op.decl}' reads its keys and values from "
                        f"{describe(block, op.args[1])}, which comes from the block's own state: a decoder-only "
                        "block has no encoder memory", op.span, hint=_CROSS_HINT)
    calls = [(op, d) for op in block.ops if (d := callee(program, block, op)) is not None]
    for op, d in calls:
        inner = program.block(d.block)
        for j in sorted(facts[d.block].memory_params):
            if j < len(op.operands) and not ancestors(block, op.operands[j]) & memory:
                yield error("E0404", f"'{d.name}' ({d.block}) reads encoder memory through cross-attention from its "
                            f"input '{inner.inputs[j].result}', but this block passes {describe(block, op.operands[j])}, "
                            "which comes from its own state: a decoder-only block has no encoder memory", op.span,
                            notes=[Note(f"'{d.block}' is defined here", inner.span)], hint=_CROSS_HINT)
    yield from _noncausal_decoder(program, block, crosses, calls)


_CROSS_HINT = ("use self_attention; cross-attention belongs to the decoder of an encoder–decoder and reads a "
               "separate memory input")


def _noncausal_decoder(program: Program, block: Block, crosses: list[Op],
                       calls: list[tuple[Op, InstanceDecl]]) -> Iterator[Diagnostic]:
    """A decoder's self-attention must be causal, wherever the decoder's pieces are written."""
    facts = summaries(program)
    own = next((d for d in block.decls if isinstance(d, KindDecl) and d.kind == "self_attention"
                and d.arg("causal") is False), None)
    if crosses and own is not None:
        yield _noncausal_error(own.name, own.span, crosses[0].decl, own.span, [])
        return
    # parts that each hold one half: this block's own ops, and each call; a part holding both reports itself
    parts = [(bool(crosses), own is not None, None)] + \
            [(facts[d.block].has_cross, facts[d.block].noncausal_self is not None, (op, d)) for op, d in calls]
    if any(c and n for c, n, _ in parts) or not any(c for c, _, _ in parts):
        return
    for _, noncausal, where in parts:
        if not noncausal:
            continue
        cross = crosses[0].decl if crosses else next(d.name for op, d in calls if facts[d.block].has_cross)
        if where is None:
            yield _noncausal_error(own.name, own.span, cross, own.span, [])  # type: ignore[union-attr]
        else:
            op, d = where
            inner = facts[d.block].noncausal_self
            yield _noncausal_error(f"{d.name}.{inner.path}", op.span, cross, inner.span, [])  # type: ignore[union-attr]
        return


def _noncausal_error(name: str, span: Span, cross: str, decl_span: Span, notes: list[Note]) -> Diagnostic:
    if decl_span != span:
        notes = notes + [Note("declared here", decl_span)]
    return error("E0413", f"self-attention '{name}' of a decoder layer (it reads encoder memory through "
                 f"'{cross}') is declared causal=false: each target row would see later targets", span,
                 notes=notes, hint="set causal=true: the attention mask controls what a row sees; the residual "
                                   "add only carries the row's own state")


def _branch_order(program: Program, block: Block) -> Iterator[Diagnostic]:
    rank = {**{k: 0 for k in SELF}, "cross_attention": 1, **{k: 2 for k in MLPS}}
    seq = [(rank[k], k, name, op) for k, name, op in stream_items(program, block, summaries(program)) if k in rank]
    if not any(r == 1 for r, *_ in seq):
        return
    for (r1, k1, n1, op1), (r2, k2, n2, op2) in zip(seq, seq[1:]):
        if r2 < r1 and op1 is not op2:  # two steps inside one called block are that block's own report
            order = ", ".join(k for _, k, _, _ in seq)
            yield error("E0405", f"decoder branches run in the order {order}: '{n2}' ({k2}) comes after "
                        f"'{n1}' ({k1})", op2.span, notes=[Note(f"'{n1}' runs here", op1.span)],
                        hint="an encoder–decoder decoder layer runs masked self-attention, then cross-attention, "
                             "then the MLP")
            return


def _views(program: Program, block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    """One call reading several arguments from different transforms of the same state."""
    stop = w.spine_set | {op.result for op in block.inputs}
    for op in block.ops:
        d = callee(program, block, op)
        if not op.has(Calls) or len(op.args) < 2 or decl_kind(block, op) == "cross_attention" \
                or d is not None and summaries(program)[d.block].memory_params:
            continue  # cross-attention (here or in the called block) reads keys and values from another source
        seen: dict[str, tuple[tuple[str, ...], str]] = {}
        for i, arg in enumerate(op.args):
            source, chain = _source(block, arg, stop)
            if source in seen and seen[source][0] != chain:
                yield error("E0406", f"'{op.decl}' reads different views of {describe(block, source)}: "
                            f"{describe(block, seen[source][1])} and {describe(block, arg)} (argument {i + 1})",
                            op.span, hint="normalize the state once and pass that value as query, key and value; "
                                          "only cross-attention reads keys and values from another source")
                break
            seen.setdefault(source, (chain, arg))


def _source(block: Block, v: str, stop: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    chain: list[str] = []
    while v not in stop:
        op = block.producers.get(v)
        if op is None or len(op.operands) != 1 or op.has(Calls) and decl_kind(block, op) != "activation":
            break
        chain.append(getattr(op, "decl", None) or type(op).__name__)
        v = op.operands[0]
    return v, tuple(chain)


def verify_block(program: Program, block: Block, base: dict, counts: dict[str, tuple[int, ...]]) -> list[Diagnostic]:
    w = wrapper(block)
    env = block_env(base, block, 0, counts.get(block.name, (1,))[0])
    out: list[Diagnostic] = []
    for check in (_dropouts(program, block, w, env), _layer_drops(block, w, env), _training(block, env),
                  _shortcuts(block, w), _gates(block, w),
                  _normalized_shortcut(block, w, env), _normalized_into_state(program, block, w, env),
                  _final_norm(program, block, env),
                  _cross_attention(program, block, w), _branch_order(program, block), _views(program, block, w)):
        out += check
    return out


@verifier("topology")
def verify_topology(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    counts = layer_counts(program, base)
    return [d for b in program.blocks for d in verify_block(program, b, base, counts)]
