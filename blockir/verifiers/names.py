"""Unused declarations and values: legal, but usually a mistake worth a warning."""
from __future__ import annotations

from blockir.diagnostics import Diagnostic, warning
from blockir.ir.decls import KindDecl
from blockir.ir.program import Program
from blockir.verifiers.registry import verifier


@verifier("names")
def verify_names(program: Program) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for block in program.blocks:
        used_decls = {d for op in block.ops for d in op.applied} | {
            d.arg(a.name) for d in block.decls if isinstance(d, KindDecl) for a in d.spec.args if a.kind == "decl"}
        for d in block.decls:
            if d.name not in used_decls:
                out.append(warning("W0103", f"declaration '{d.name}' is never used", d.span,
                                   hint="remove it, or apply it in an equation; unused state still loads from checkpoints"))
        used_values = {v for op in block.ops for v in op.operands}
        inputs = {id(op) for op in block.inputs}  # reported below, as inputs
        for op in block.ops:
            if id(op) in inputs:
                continue
            for r in op.results:
                if r not in used_values and not r.startswith("%") and r not in getattr(op, "more", ()):
                    out.append(warning("W0120", f"value '{r}' is never used", op.span,
                                       hint="a computed state that is never read usually means a missing residual add"))
        for op in block.inputs:
            if op.result not in used_values:
                out.append(warning("W0120", f"input '{op.result}' is never used", op.span))
    return out
