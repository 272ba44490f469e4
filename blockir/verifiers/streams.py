"""Carried streams: the values a multi-result block returns after its hidden state, and attention scores.

A stack threads result i of each layer into input i of the next, so a carried
result must have the type of the input it feeds. Attention scores
``[B, H, T, S]`` (RealFormer, arXiv:2012.11747) are their own kind of value:
they are added to the next attention's pre-softmax scores and never join the
hidden stream (failure-lab bug 35); one score route serves one attention
family, whose axes and masks it was computed under (bug 46); and they live
only inside the model's forward, never as its input or result (a decode-time
cache or a returned history, bug 47).
"""
from __future__ import annotations

from blockir.analyses.structure import describe, wrapper
from blockir.analyses.summaries import Summary, callee, score_routes, summaries
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.traits import Calls, Combines, Concatenates, Modifier, ResidualSum, Scales
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier


def _check_stack(program: Program, block: Block, decl: InstanceDecl, summary: Summary) -> list[Diagnostic]:
    inner = program.block(decl.block)
    out = []
    if len(inner.results) > len(inner.params):
        out.append(error("E0422", f"stack '{decl.name}' of '{inner.name}' carries {len(inner.results)} streams, "
                         f"but '{inner.name}' takes {len(inner.params)} inputs", decl.span,
                         notes=[Note("declared here", inner.span)],
                         hint="result i of a layer feeds input i of the next: declare an input for each result"))
        return out
    for i, (result, param) in enumerate(zip(inner.results, inner.params)):
        if result.names != param.type.names:
            out.append(error("E0422", f"stack '{decl.name}' threads result {i + 1} of '{inner.name}' ({result}) into "
                             f"input '{param.name}' {param.type} of the next layer", decl.span,
                             notes=[Note("declared here", inner.span)],
                             hint="a carried stream keeps its type from layer to layer; order the results as the "
                                  "inputs they feed"))
            break
        families = summary.score_readers.get(i, frozenset()) | summary.score_writers.get(i, frozenset())
        if i and len(families) > 1:
            out.append(error("E0424", f"stack '{decl.name}' threads one score route through "
                             f"{' and '.join(sorted(families))} of '{inner.name}'", decl.span,
                             notes=[Note("declared here", inner.span)],
                             hint="give each attention family its own carried scores: an input and a result each"))
    return out


def _joins_stream(block: Block, op: Op) -> Diagnostic | None:
    if not (op.has(Combines) or op.has(Concatenates)):
        return None
    scores = [v for v in op.operands if block.type_of(v).is_scores]
    other = [v for v in op.operands if not block.type_of(v).is_scores]
    if not scores or not other:
        return None
    return error("E0423", f"attention scores {describe(block, scores[0])} {block.type_of(scores[0])} join the hidden "
                 f"state {describe(block, other[0])} {block.type_of(other[0])}", op.span,
                 notes=[Note(f"{describe(block, scores[0])} carries scores", block.producers[scores[0]].span)],
                 hint="scores are added to the next attention's pre-softmax scores (score_residual=sum), never "
                      "to the residual stream")


def _check_axes(block: Block, op: Op) -> Diagnostic | None:
    """The scores an attention takes have its own axes: query rows, then key rows."""
    d = block.decl_map[op.decl]
    t = block.type_of(op.args[-1])
    keys = op.args[1] if d.kind == "cross_attention" else op.args[0]
    want = (block.type_of(op.args[0]).rows[-1:] + block.type_of(keys).rows[-1:])
    if t.is_scores and t.names[2:] == want:
        return None
    return error("E0424", f"{d.kind} '{d.name}' computes scores over [{', '.join(want)}] (queries, keys), but "
                 f"{describe(block, op.args[-1])} is {t}", op.span, notes=[Note("declared here", d.span)],
                 hint="pass the score state of this attention's own route: [B, H, queries, keys]")


def _check_routes(program: Program, block: Block, shared: set[str]) -> list[Diagnostic]:
    """Score values that two attention families write or read; their names are added to ``shared``."""
    out = []
    for value, uses in score_routes(program, block, summaries(program)).items():
        families = sorted({f for f, _ in uses})
        if len(families) > 1:
            shared.add(value)
            where = next(op for f, op in uses if f == families[-1])
            out.append(error("E0424", f"score state {describe(block, value)} is shared by {' and '.join(families)}",
                             where.span, notes=[Note(f"{f} here", op.span) for f, op in uses[:1]],
                             hint="each attention family (encoder self, decoder self, cross) has its own axes and "
                                  "masks: carry one score state per family"))
    return out


def _check_model(block: Block) -> list[Diagnostic]:
    if block.kind != "model":
        return []
    out = []
    for p in block.params:
        if p.type.is_scores:
            out.append(error("E0425", f"model '{block.name}' takes attention scores '{p.name}' {p.type} as an input",
                             p.span, hint="score states start inside the model (zeros([B, H, S, S])) and end with "
                                          "its forward; they are not a decode-time cache"))
    for i, t in enumerate(block.results):
        if t.is_scores:
            out.append(error("E0425", f"model '{block.name}' returns attention scores {t} as result {i + 1}",
                             block.output.span if block.output else block.span,
                             hint="score states end with the forward; return only the hidden state"))
    return out


def _unweighted(block: Block, v: str) -> str | None:
    """The carried input ``v`` is, seen through casts and dropout (a learned weight makes it a mix, not a join)."""
    carried = {p.name for p in block.params[1:1 + len(block.more_results)]}
    op = block.producers.get(v)
    while op is not None and op.has(Modifier) and not op.has(Scales):
        v = op.operands[0]
        op = block.producers.get(v)
    # scores joining the stream are E0423's
    return v if v in carried and not block.type_of(v).is_scores else None


def _joins_hidden(block: Block) -> list[Diagnostic]:
    """A carried stream of the hidden state's type added, unweighted, to the hidden state: the stream it was
    carried beside silently becomes part of the residual, once per layer."""
    if not block.more_results:
        return []
    spine = set(wrapper(block).spine)
    out = []
    for op in block.ops:
        if not (op.has(ResidualSum) and op.has(Combines)):
            continue
        for mine, other in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
            carried = _unweighted(block, mine)
            if carried is not None and other in spine:
                out.append(error("E0426", f"the carried stream '{carried}' is added to the hidden state "
                                 f"{describe(block, other)} without a weight: carried beside the hidden state, it "
                                 "joins it in every layer", op.span,
                                 hint="mix streams with learned weights (hyper-connections: a1 * h1 + a2 * h2), or "
                                      "feed the carried value to a branch; a stream that belongs to the hidden state "
                                      "is not carried"))
                break
    return out


def verify_block(program: Program, block: Block) -> list[Diagnostic]:
    out = _check_model(block) + _joins_hidden(block)
    if block.result.is_scores:
        out.append(error("E0423", f"{block.kind} '{block.name}' declares attention scores {block.result} as its "
                         "hidden state", block.span,
                         hint="the hidden state comes first; carried scores follow: -> ([B, S, D], [B, H, S, S])"))
    shared: set[str] = set()
    out += _check_routes(program, block, shared)
    for op in block.ops:
        d = _joins_stream(block, op)
        if d is not None:
            out.append(d)
        decl = block.decl_map.get(getattr(op, "decl", None) or "")
        # a route two families share is reported once, as shared, not again as the wrong axes for one of them
        if op.has(Calls) and isinstance(decl, KindDecl) and decl.arg("score_residual") is not None \
                and op.args[-1] not in shared:
            d = _check_axes(block, op)
            if d is not None:
                out.append(d)
        target = callee(program, block, op)
        if target is not None and target.count is not None:
            out += _check_stack(program, block, target, summaries(program)[target.block])
    return out


@verifier("streams")
def verify_streams(program: Program) -> list[Diagnostic]:
    return [d for block in program.blocks for d in verify_block(program, block)]
