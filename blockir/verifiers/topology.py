"""Topology: where dropout, shortcuts, cross-attention and final norms sit.

Branch dropout drops the update before the add, never the shortcut nor the
sum (seed 0x0A). A stack whose layers leave the stream unnormalized ends with
a norm (0x09). Cross-attention belongs to the decoder of an encoder–decoder,
after masked self-attention and before the MLP (0x07). The shortcut is the
identity unless a recipe scales it; DeepNorm's α and β depend on the
architecture (0x09A). A fused add+norm's normalized output is the branch
input, its residual output the stream (0x0AA).
"""
from __future__ import annotations

import math
from typing import Iterator

from blockir.analyses.sizes import block_env, layer_counts, program_env, uses_layer, value
from blockir.analyses.facts import stated
from blockir.analyses.structure import (Wrapper, ancestors, decl_kind, describe, is_linear, normalized_shortcut,
                                        wrapper)
from blockir.diagnostics import Diagnostic, Note, error, warning
from blockir.ir.consts import ConstExpr
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.ops import CallOp, CastOp, DropoutOp, FusedAddNormOp, NormOp, Op, ScaleOp
from blockir.ir.program import Block, Program
from blockir.analyses.classify import final_norm
from blockir.verifiers.registry import verifier

SELF = ("self_attention", "causal_self_attention")
MLPS = ("mlp", "gated_mlp")


def _p(op: DropoutOp, env: dict) -> float | int | None:
    return value(op.p, env)


# --- dropout -----------------------------------------------------------------

def _dropouts(block: Block, w: Wrapper, env: dict) -> Iterator[Diagnostic]:
    results = {s.result for s in w.sublayers} | {s.root.result for s in w.sublayers}
    for s in w.sublayers:
        for op in s.shortcut_ops:
            if isinstance(op, DropoutOp) and _p(op, env) != 0:
                yield error("E0401", f"dropout on the identity path: the shortcut {describe(block, s.state)} of this "
                            "residual add is dropped", op.span, notes=[Note("the residual add", s.root.span)],
                            hint=f"drop the branch update, not the state: {s.state} + dropout(branch(…), p=…)")
    for v in w.spine[1:]:
        op = block.producers.get(v)
        if isinstance(op, DropoutOp) and _p(op, env) != 0:
            what = "after the residual add drops the updated state" if op.operand in results \
                else f"on the residual state drops {describe(block, op.operand)} itself"
            yield error("E0402", f"dropout {what}, not a branch update", op.span,
                        hint="apply dropout to the branch output before the add: x + dropout(branch(…), p=…)")


def _training(block: Block, env: dict) -> Iterator[Diagnostic]:
    fact = stated(block, env).get("training")
    if fact is None or fact.value != 0:
        return
    for op in block.ops:
        p = _p(op, env) if isinstance(op, DropoutOp) else 0
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
            if isinstance(op, ScaleOp) and op.param is not None:
                kind = block.decl_map[op.param].kind if op.param in block.decl_map else "scale"
                yield warning("W0402", f"the shortcut is gated by the learned {kind} '{op.param}': the direct route "
                              "across this add is a trained scale, not the identity", op.span,
                              hint="gate the branch instead (ReZero, LayerScale: x + g * f(x)); a recipe's fixed "
                                   "shortcut constant (DeepNorm's alpha) is a constant, not a parameter")


def _normalized_shortcut(block: Block, w: Wrapper) -> Iterator[Diagnostic]:
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
                         "residual is the stream")


# --- stacks --------------------------------------------------------------------

def _has_norms(program: Program, block: Block, seen: frozenset[str] = frozenset()) -> bool:
    if any(isinstance(op, (NormOp, FusedAddNormOp)) for op in block.ops):
        return True
    inner = [d.block for d in block.decls if isinstance(d, InstanceDecl) and d.block in program.block_map]
    return any(_has_norms(program, program.block(b), seen | {block.name}) for b in inner if b not in seen)


def _ends_normalized(block: Block) -> bool:
    out = block.output
    op = block.producers.get(out.value) if out is not None else None
    return isinstance(op, NormOp) or isinstance(op, FusedAddNormOp) and out.value == op.normalized


def _unnormalized_member(program: Program, block: Block) -> tuple[CallOp, Block] | None:
    """The stacked block whose output this model returns without a norm, if it normalizes at all."""
    out = block.output
    v = out.value if out is not None else None
    op = block.producers.get(v) if v else None
    while isinstance(op, (CastOp, DropoutOp, ScaleOp)):
        op = block.producers.get(op.operand)
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if not isinstance(op, CallOp) or not isinstance(decl, InstanceDecl) or decl.block not in program.block_map:
        return None
    member = program.block(decl.block)
    if _ends_normalized(member) or not _has_norms(program, member):
        return None
    if member.kind == "model" and _unnormalized_member(program, member) is None:
        return None
    return op, member


def _final_norm(program: Program, block: Block, env: dict) -> Iterator[Diagnostic]:
    if block.kind != "model" or block.output is None:
        return
    fact = stated(block, env).get("final_norm")
    present = final_norm(block)
    needed = _unnormalized_member(program, block)
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
    if needed is not None and present is None:
        call, member = needed
        yield error("E0403", f"model '{block.name}' returns the output of '{call.decl}' ({member.name}) without a "
                    f"final norm, but '{member.name}' leaves its last residual add unnormalized", block.output.span,
                    notes=[Note("the stack", block.decl_map[call.decl].span)],
                    hint="end the model with a norm (return norm(layers(x))); if the output head applies it, "
                         "state that with `const final_norm = 0`")


# --- encoder–decoder -------------------------------------------------------------

def _cross_attention(block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    memory_inputs = {op.result for op in block.inputs} - {w.state_input}
    crosses = [op for op in block.ops if isinstance(op, CallOp) and decl_kind(block, op) == "cross_attention"]
    for op in crosses:
        # with the arguments swapped (queries from memory) the shape verifier reports E0206 instead
        if len(op.args) == 2 and not (ancestors(block, op.args[0]) | ancestors(block, op.args[1])) & memory_inputs:
            yield error("E0404", f"cross-attention '{op.decl}' reads its keys and values from "
                        f"{describe(block, op.args[1])}, which comes from the block's own state: a decoder-only "
                        "block has no encoder memory", op.span,
                        hint="use self_attention; cross-attention belongs to the decoder of an encoder–decoder and "
                             "reads a separate memory input")
    if crosses:
        for d in block.decls:
            if isinstance(d, KindDecl) and d.kind == "self_attention" and d.arg("causal") is False:
                yield error("E0413", f"self-attention '{d.name}' of a decoder layer (it reads encoder memory through "
                            f"'{crosses[0].decl}') is declared causal=false: each target row would see later targets",
                            d.span, hint="set causal=true: the attention mask controls what a row sees; the residual "
                                         "add only carries the row's own state")


def _branch_order(block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    rank = {**{k: 0 for k in SELF}, "cross_attention": 1, **{k: 2 for k in MLPS}}
    seq = [(rank[b.kind], b) for s in w.sublayers if len(s.branches) == 1 for b in s.branches if b.kind in rank]
    if not any(r == 1 for r, _ in seq):
        return
    for (r1, b1), (r2, b2) in zip(seq, seq[1:]):
        if r2 < r1:
            order = ", ".join(b.kind for _, b in seq)
            yield error("E0405", f"decoder branches run in the order {order}: '{b2.name}' ({b2.kind}) comes after "
                        f"'{b1.name}' ({b1.kind})", (b2.call or block.producers[b2.leaf]).span,
                        notes=[Note(f"'{b1.name}' runs here", (b1.call or block.producers[b1.leaf]).span)],
                        hint="an encoder–decoder decoder layer runs masked self-attention, then cross-attention, "
                             "then the MLP")
            return


def _views(block: Block, w: Wrapper) -> Iterator[Diagnostic]:
    """One call reading several arguments from different transforms of the same state."""
    stop = w.spine_set | {op.result for op in block.inputs}
    for op in block.ops:
        if not isinstance(op, CallOp) or len(op.args) < 2 or decl_kind(block, op) == "cross_attention":
            continue  # cross-attention reads keys and values from another source by design
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
        if op is None or len(op.operands) != 1 or isinstance(op, CallOp) and decl_kind(block, op) != "activation":
            break
        chain.append(getattr(op, "decl", None) or type(op).__name__)
        v = op.operands[0]
    return v, tuple(chain)


# --- DeepNorm constants ------------------------------------------------------------

ALPHA = {"single": lambda n, m: (2 * n) ** 0.25, "decoder": lambda n, m: (3 * m) ** 0.25,
         "encoder": lambda n, m: 0.81 * (n ** 4 * m) ** (1 / 16)}
BETA = {"single": lambda n, m: (8 * n) ** -0.25, "decoder": lambda n, m: (12 * m) ** -0.25,
        "encoder": lambda n, m: 0.87 * (n ** 4 * m) ** (-1 / 16)}
ROW = {"single": "the encoder-only / decoder-only row, (2L)^(1/4) and (8L)^(-1/4)",
       "decoder": "the encoder–decoder decoder row, (3M)^(1/4) and (12M)^(-1/4)",
       "encoder": "the encoder–decoder encoder row, 0.81(N^4 M)^(1/16) and 0.87(N^4 M)^(-1/16)"}


def _has_cross(block: Block) -> bool:
    return any(isinstance(op, CallOp) and decl_kind(block, op) == "cross_attention" for op in block.ops)


def _architecture(program: Program, block: Block, counts: dict[str, tuple[int, ...]]) -> tuple[str, int, int]:
    """(row of the DeepNet table, N encoder layers, M decoder layers) for this block."""
    own = counts.get(block.name, (1,))[0]
    stacked = [b for b in program.blocks if b.name in counts and b.kind == "block"]
    if _has_cross(block):
        encoders = [b for b in stacked if not _has_cross(b)]
        return "decoder", counts[encoders[0].name][0] if encoders else own, own
    decoders = [b for b in stacked if _has_cross(b)]
    if decoders and block.name in counts:
        return "encoder", own, counts[decoders[0].name][0]
    return "single", own, own


def _deepnorm(program: Program, block: Block, w: Wrapper, base: dict,
              counts: dict[str, tuple[int, ...]]) -> Iterator[Diagnostic]:
    scales = [op for s in w.sublayers if s.post_norm is not None for op in s.shortcut_ops
              if isinstance(op, ScaleOp) and op.factor is not None]
    if not scales:
        return
    arch, n, m = _architecture(program, block, counts)
    gains = [d for d in block.decls if isinstance(d, KindDecl) and d.arg("init_gain") is not None]
    checks: list[tuple[str, ConstExpr, dict, Op | KindDecl]] = [("alpha", scales[0].factor, ALPHA, scales[0])]
    checks += [("beta", d.arg("init_gain"), BETA, d) for d in gains[:1]]
    env = block_env(base, block, 0, m if arch == "decoder" else n)
    for name, expr, table, site in checks:
        if uses_layer(expr, block):
            continue
        got = value(expr, env)
        if got is None:
            continue
        row = next((r for r in table if math.isclose(got, table[r](n, m), rel_tol=1e-9)), None)
        if row is not None and row != arch:
            want = table[arch](n, m)
            yield error("E0410", f"DeepNorm {name} = {got:.6g} follows {ROW[row]}, but '{block.name}' is "
                        f"{_arch_words(arch, n, m)}: {name} should be {want:.6g}", site.span,
                        hint=f"DeepNet's constants depend on the architecture; use {ROW[arch]}")


def _arch_words(arch: str, n: int, m: int) -> str:
    if arch == "decoder":
        return f"the decoder of an encoder–decoder (it reads memory through cross-attention; M = {m})"
    if arch == "encoder":
        return f"the encoder of an encoder–decoder (N = {n}, M = {m})"
    return f"a single stack of L = {n} layers"


def verify_block(program: Program, block: Block, base: dict, counts: dict[str, tuple[int, ...]]) -> list[Diagnostic]:
    w = wrapper(block)
    env = block_env(base, block, 0, counts.get(block.name, (1,))[0])
    out: list[Diagnostic] = []
    for check in (_dropouts(block, w, env), _training(block, env), _shortcuts(block, w),
                  _normalized_shortcut(block, w), _final_norm(program, block, env), _cross_attention(block, w),
                  _branch_order(block, w), _views(block, w), _deepnorm(program, block, w, base, counts)):
        out += check
    return out


@verifier("topology")
def verify_topology(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    counts = layer_counts(program, base)
    return [d for b in program.blocks for d in verify_block(program, b, base, counts)]
