"""Distributed ownership: values combined, normalized and passed on must agree on where they live.

A residual add is elementwise over the logical tensor, so both operands need
the same ownership map, not just the same local shape. A pending sum
(``partial``) added to a replicated or sharded shortcut makes every rank
add the shortcut, and the later reduction yields P·x + u (Shoeybi et al.,
2019, reduce the row-parallel output before the residual add). A norm
over a feature axis split across ranks needs the global Σx and Σx² of each
row: per-shard moments use a different denominator on every rank. A norm
over rows split across ranks (sequence parallelism, Korthikanti et al.,
2022) computes complete rows, but each rank's affine gradient covers only
its rows and must be summed. A value passed to a block or extern that
declares another placement needs the collective that moves it. Dropout needs
no rule here: every site, an attention declaration's probabilities included,
keys its decisions by logical coordinates, so a rank draws the unsharded run's
masks for the slice it holds (docs/distributed.md, "Dropout under sharding").
"""
from __future__ import annotations

from blockir.analyses.layouts import (
    BlockLayouts,
    all_contexts,
    describe_layout,
    norm_sites,
    partial,
    same,
    sharded,
)
from blockir.norms import family
from blockir.analyses.structure import describe
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Program
from blockir.verifiers.registry import verifier

COLLECTIVE = {
    ("partial", "replicate"): "an all-reduce",
    ("partial", "shard"): "a reduce-scatter",
    ("shard", "replicate"): "an all-gather",
    ("replicate", "shard"): "a local slice",
    ("shard", "shard"): "an all-to-all",
}


def _adds(ctx: BlockLayouts) -> list[Diagnostic]:
    block, out = ctx.block, []
    for op in block.ops:
        if len(op.terms()) != 2:
            continue
        lhs, rhs = op.terms()
        a, b = ctx.of(lhs), ctx.of(rhs)
        if same(a, b):
            continue
        pending, other = (rhs, lhs) if partial(b) and not partial(a) else (lhs, rhs) if partial(a) and not partial(b) \
            else (None, None)
        if pending is not None:
            meshes = ", ".join(partial(ctx.of(pending)))
            if op.SYMBOL == "-":
                joined = f"subtracted from {describe(block, other)}" if pending == rhs else \
                    f"that {describe(block, other)} is subtracted from"
                what = "apply the other operand"
            else:
                joined, what = f"added to {describe(block, other)}", "add the shortcut"
            out.append(error(
                "E0602", f"{describe(block, pending)} is a pending sum over {meshes} {joined} "
                f"({describe_layout(ctx.of(other))}): every rank would {what}, and reducing afterwards "
                "counts it once per rank", op.span,
                notes=[Note(f"{describe(block, pending)} is {describe_layout(ctx.of(pending))}",
                            block.producers[pending].span)],
                hint="reduce the branch to the stream's placement before the add (all-reduce, or reduce-scatter "
                     "for a sharded stream), so the shortcut is added once"))
            continue
        out.append(error(
            "E0601", f"operands of '{'-' if op.SYMBOL == '-' else '+'}' are placed differently: "
            f"{describe(block, lhs)} is {describe_layout(a)}, "
            f"{describe(block, rhs)} is {describe_layout(b)}", op.span,
            hint="a residual add needs the same ownership map on both sides, not only the same local shape"))
    return out


def _norms(ctx: BlockLayouts) -> list[Diagnostic]:
    block, out = ctx.block, []
    for op, name, layout in norm_sites(ctx):
        decl = block.decl_map.get(name)
        if not isinstance(decl, KindDecl):
            continue
        axes: tuple[str, ...] = decl.arg("axes") or ()
        split = [m for a in axes for m in sharded(layout, a)]
        if split and decl.arg("moments") == "local":
            out.append(error(
                "E0603", f"{decl.kind} '{decl.name}' takes local moments of a row whose {', '.join(axes)} is split "
                f"over {', '.join(split)}: each rank would normalize its slice with its own mean and variance",
                op.span, notes=[Note("declared here", decl.span)],
                hint="a feature-sharded row needs global moments: one all-reduce of the row's sum and sum of "
                     "squares (drop moments=local)"))
        t = block.type_of(op.norm_input())  # type: ignore[arg-type]
        rows = [m for a in t.rows for m in sharded(layout, a)]
        if rows and decl.arg("affine_grad") == "local" and family(decl).weight(decl):
            out.append(error(
                "E0604", f"{decl.kind} '{decl.name}' normalizes rows split over {', '.join(rows)} but keeps each "
                "rank's affine gradient: every rank sees only its own rows, so the weight update would miss the "
                "others", op.span, notes=[Note("declared here", decl.span)],
                hint="sum the affine gradients over the ranks that own rows (drop affine_grad=local)"))
    return out


def _boundaries(ctx: BlockLayouts) -> list[Diagnostic]:
    block, out = ctx.block, []
    for b in ctx.boundaries:
        if same(b.found, b.declared):
            continue
        kinds = {p.kind for p in b.found if p.kind != "replicate"} or {"replicate"}
        wanted = {p.kind for p in b.declared if p.kind != "replicate"} or {"replicate"}
        moves = sorted({COLLECTIVE.get((k, w), "a redistribution") for k in kinds for w in wanted})
        out.append(error(
            "E0605", f"{describe(block, b.value)} is {describe_layout(b.found)}, but {b.target} is "
            f"{describe_layout(b.declared)}: moving it takes {' and '.join(moves)}, which nothing between them performs",
            b.op.span, notes=[Note("declared here", b.declared_at)],
            hint="declare the same placement on both sides, or pass the value through a declaration whose "
                 "signature performs the collective"))
    return out


@verifier("ownership")
def verify_ownership(program: Program) -> list[Diagnostic]:
    seen: set[tuple[str, str, int, int, str]] = set()
    out: list[Diagnostic] = []
    for ctx in all_contexts(program):
        for d in _adds(ctx) + _norms(ctx) + _boundaries(ctx):
            key = (d.code, d.span.filename, d.span.line, d.span.column, d.message)
            if key not in seen:
                seen.add(key)
                out.append(d)
    return out
