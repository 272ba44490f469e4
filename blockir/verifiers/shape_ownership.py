"""Shape and row ownership: a residual add joins two tensors with the same axes, by name.

Matching rank or sizes is not enough: ``[B,S,D] + [B,S,F]`` is an
MLP intermediate, ``[B,S,D] + [B,H,S,Dh]`` unmerged heads, and
``[B,T,D] + [B,S,D]`` adds rows owned by another sequence even when T and S
have the same size. Calls must also receive the axes their declarations take.
"""
from __future__ import annotations

from blockir.analyses.sizes import Sizes
from blockir.analyses.structure import ancestors, decl_kind, describe, state_input, wrapper
from blockir.diagnostics import BlockError, Diagnostic, Note, error
from blockir.ir.decls import ExternDecl, InstanceDecl, KindDecl
from blockir.ir.traits import Calls, Combines, Concatenates, Learned, Scales
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.ir.types import Role, TensorType
from blockir.verifiers.registry import verifier

SPLIT_HEADS = (Role.HEADS, Role.HEAD_DIM)
MODEL_WIDTH_KINDS = ("self_attention", "cross_attention", "mlp", "gated_mlp", "moe")


def _rows(t: TensorType) -> str:
    return "[" + ", ".join(t.rows) + "]"


def _memory_input(block: Block, value: str, state: str | None) -> str | None:
    """The non-state input ``value`` is (directly, or through scales, dropouts and casts)."""
    inputs = {op.result for op in block.inputs} - {state}
    v = value
    while v not in inputs:
        op = block.producers.get(v)
        if op is None or len(op.operands) != 1 or op.has(Calls):
            return None
        v = op.operands[0]
    return v


def _query_from_memory(block: Block, value: str, state: str | None) -> tuple[Op, str] | None:
    """A cross-attention that produced ``value`` from a query taken from memory."""
    op = block.producers.get(value)
    while op is not None and not op.has(Calls) and len(op.operands) == 1:
        op = block.producers.get(op.operands[0])
    if op is not None and op.has(Calls) and decl_kind(block, op) == "cross_attention":
        inputs = {i.result for i in block.inputs} - {state}
        memory = ancestors(block, op.args[0]) & inputs
        if memory:
            return op, sorted(memory)[0]
    return None


WHAT = {"+": "a residual add", "-": "a difference of tensors", "*": "a product of tensors"}


def _check_add(block: Block, op: Op, state: str | None) -> Diagnostic | None:
    sign = op.SYMBOL
    lt, rt = block.type_of(op.lhs), block.type_of(op.rhs)
    if lt.names == rt.names or lt.is_scores != rt.is_scores:  # scores meeting the stream: the streams verifier
        return None
    # measure the odd operand against the one that has the stream's axes
    keep, odd = (op.lhs, op.rhs) if lt.names == block.result.names or rt.names != block.result.names \
        else (op.rhs, op.lhs)
    kt, ot = block.type_of(keep), block.type_of(odd)
    where = block.producers.get(odd)
    notes = [Note(f"{describe(block, odd)} is {ot}", where.span)] if where is not None else []
    if any(a.role in SPLIT_HEADS for a in ot.axes) and not any(a.role in SPLIT_HEADS for a in kt.axes):
        return error("E0204", f"{describe(block, odd)} still has its heads split ({ot}); the stream is {kt}",
                     op.span, notes=notes,
                     hint="merge the heads and apply the output projection before the residual add")
    if ot.rows != kt.rows:
        memory = _memory_input(block, odd, state)
        if memory is not None:
            return error("E0206", f"encoder memory '{memory}' {ot} is added to the decoder state "
                         f"{describe(block, keep)} {kt}", op.span, notes=notes,
                         hint="memory is read by cross-attention as keys and values; only the cross-attention "
                              "output, indexed by the decoder rows, joins the residual")
        crossed = _query_from_memory(block, odd, state)
        if crossed is not None:
            call, memory = crossed
            return error("E0206", f"cross-attention '{call.decl}' takes its queries from '{memory}', so its output has"
                         f" rows {_rows(ot)}, not the decoder rows {_rows(kt)}", op.span,
                         notes=[Note("called here", call.span)],
                         hint=f"pass the decoder state first and memory second: {call.decl}(norm(state), {memory})")
        return error("E0202", f"'{sign}' joins different row owners: {describe(block, keep)} has rows {_rows(kt)}, "
                     f"{describe(block, odd)} has rows {_rows(ot)}", op.span, notes=notes,
                     hint="a residual update must be indexed by the rows of the state it updates, "
                          "even when the sizes agree")
    if ot.names[:-1] == kt.names[:-1] and ot.last is not None and kt.last is not None:
        hidden = ot.last.role == Role.HIDDEN
        return error("E0203", f"{describe(block, odd)} has width {ot.last.name}, the stream has width {kt.last.name}"
                     f" ({ot} vs {kt})", op.span, notes=notes,
                     hint=f"contract {ot.last.name} back to {kt.last.name} (the MLP's down projection) before the add"
                     if hidden else f"project the branch to {kt.last.name} before the add")
    return error("E0201", f"operands of '{sign}' have different axes: {describe(block, op.lhs)} is {lt}, "
                 f"{describe(block, op.rhs)} is {rt}", op.span, notes=notes,
                 hint=f"{WHAT[sign]} is elementwise: both sides "
                      "need the same axes, in the same order")


def _check_channel(block: Block, op: Op) -> Diagnostic | None:
    """A learned vector or bias runs along the last axis of the value it applies to."""
    decl = block.decl_map.get(op.param or "")  # type: ignore[union-attr]
    if not isinstance(decl, KindDecl) or decl.arg("axis") is None:
        return None
    operand = op.operands[0]
    t = block.type_of(operand)
    if t.last is not None and t.last.name == decl.arg("axis"):
        return None
    return error("E0213", f"{decl.kind} '{decl.name}' runs along {decl.arg('axis')}, but {describe(block, operand)} "
                 f"is {t}", op.span, notes=[Note("declared here", decl.span)],
                 hint="declare it over the last axis of the value it applies to")


def _is_skip(block: Block, op: Op) -> bool:
    """A U-Net skip: the joined states are read only by linears that project them back to the stream width."""
    users = block.users.get(op.result, ())
    return bool(users) and all(u.has(Calls) and decl_kind(block, u) == "linear"
                               and isinstance(d := block.decl_map.get(u.decl), KindDecl)
                               and d.arg("out_dim") == block.result.names[-1] for u in users)


def _check_concat(block: Block, op: Op, stream: frozenset[str]) -> Diagnostic | None:
    if _is_skip(block, op):
        # the joined values are layer states: the stream, or what a block or stack returned
        states = [a for a in op.args if a in stream or decl_kind(block, block.producers[a]) in ("block", "stack")]
        widths = {a: block.type_of(a).last for a in op.args}
        odd = next((a for a in op.args if states and widths[a] != widths[states[0]]), None)
        if odd is None:
            return None
        return error("E0420", f"skip joins {describe(block, states[0])} of width {widths[states[0]].name} "
                     f"with {describe(block, odd)} of width {widths[odd].name}", op.span,
                     hint="a U-Net skip concatenates two states of the stream width before projecting 2D -> D")
    on_stream = [a for a in op.args if a in stream]
    if not on_stream:
        return None
    return error("E0205", f"concatenating the residual state {describe(block, on_stream[0])} widens it to {op.type}",
                 op.span, hint="a residual update adds the branch to the state: write 'x + branch(x)'")


def _joined_width_matches(program: Program, block: Block, joined: str, in_dim: str) -> bool:
    """Whether a linear's input dim has the size of the axes a concat joined (unknown sizes are not judged)."""
    producer = block.producers.get(joined)
    if producer is None or not producer.has(Concatenates):
        return False
    try:
        sizes = Sizes.of(program)
    except BlockError:
        return True
    parts = [sizes.known(block.type_of(a).last.size) for a in producer.args]  # type: ignore[union-attr]
    want = sizes.known(program.dim_map[in_dim].size) if in_dim in program.dim_map else None
    return want is None or None in parts or sum(parts) == want  # type: ignore[arg-type]


def _signature(program: Program, block: Block, op: Op) -> list[tuple[str, TensorType, object]]:
    decl = block.decl_map.get(op.decl)
    if isinstance(decl, ExternDecl):
        return [(p.name, p.type, decl.span) for p in decl.params]
    if isinstance(decl, InstanceDecl) and decl.block in program.block_map:
        callee = program.block(decl.block)
        return [(p.name, p.type, p.span) for p in callee.params]
    return []


def _check_call(program: Program, block: Block, op: Op) -> list[Diagnostic]:
    out = []
    for (name, want, span), arg in zip(_signature(program, block, op), op.args):
        got = block.type_of(arg)
        if got.names != want.names:
            out.append(error("E0207", f"'{op.decl}' takes {name}: {want}, got {describe(block, arg)} {got}", op.span,
                             notes=[Note("declared here", span)],
                             hint="pass a value with the declared axes, or fix the declared signature"))
    decl = block.decl_map.get(op.decl)
    if not isinstance(decl, KindDecl) or not op.args:
        return out
    got = block.type_of(op.args[0])
    if decl.kind == "linear" and got.last is not None and got.last.name != decl.arg("in_dim") \
            and not _joined_width_matches(program, block, op.args[0], decl.arg("in_dim")):
        out.append(error("E0207", f"linear '{op.decl}' maps {decl.arg('in_dim')} to {decl.arg('out_dim')}, "
                         f"but {describe(block, op.args[0])} is {got}", op.span,
                         notes=[Note("declared here", decl.span)],
                         hint="apply it to a tensor whose last axis is its input dim"))
    if decl.kind in MODEL_WIDTH_KINDS:
        # a score-carrying attention reads the previous scores last; the streams verifier checks them
        for arg in op.args[:-1] if decl.arg("score_residual") is not None else op.args:
            t = block.type_of(arg)
            if t.last is None or t.last.role != Role.MODEL:
                out.append(error("E0207", f"{decl.kind} '{op.decl}' reads model-width rows, got {describe(block, arg)}"
                                 f" {t}", op.span, hint="branches read and return the model axis"))
    return out


def _check_output(block: Block) -> Diagnostic | None:
    out = block.output
    if out is None:
        return None
    for value, want in zip(out.values, block.results):
        got = block.type_of(value)
        if got.names != want.names:
            return error("E0208", f"{block.kind} '{block.name}' returns {describe(block, value)} {got} but declares "
                         f"{want}", out.span, notes=[Note("declared here", block.span)],
                         hint="return the updated state with the declared axes")
    return None


def verify_block(program: Program, block: Block) -> list[Diagnostic]:
    state = state_input(block)
    stream = wrapper(block).spine_set | ({state} if state else set())
    out: list[Diagnostic] = []
    for op in block.ops:
        d: Diagnostic | None = None
        if op.has(Combines):
            d = _check_add(block, op, state)
        elif op.has(Scales) or op.has(Learned):
            d = _check_channel(block, op)
        elif op.has(Concatenates):
            d = _check_concat(block, op, frozenset(stream))
        elif op.has(Calls):
            out += _check_call(program, block, op)
        if d is not None:
            out.append(d)
    # a wrong add already gives the returned value the wrong axes; say it once
    if not any(d.code in ("E0201", "E0202", "E0203", "E0204", "E0205", "E0206", "E0420") for d in out):
        d = _check_output(block)
        if d is not None:
            out.append(d)
    return out


@verifier("shape-ownership")
def verify_shape_ownership(program: Program) -> list[Diagnostic]:
    return [d for block in program.blocks for d in verify_block(program, block)]

