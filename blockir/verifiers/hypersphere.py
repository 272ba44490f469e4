"""nGPT's contract: a stream on the unit sphere is updated only by normalized interpolation.

nGPT (Loshchilov et al., arXiv:2410.01131) moves each hidden row toward a branch's
normalized proposal and retracts it to unit length, ``unit(h + alpha * (unit(f(h)) - h))``,
and projects every matrix back onto the sphere after each optimizer step. A block
that declares the sphere (``l2norm(D, hypersphere=true)``) but adds a branch to its
stream the ordinary way — or simply lost its RMSNorm — is not nGPT (E0430); a block
that interpolates on the sphere without declaring it never has its matrices
projected (E0431).
"""
from __future__ import annotations

from blockir.analyses.structure import retracted, wrapper
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier

FORM = "h = unit(x + alpha * (unit(f(x)) - x)) with a learned vector alpha"


def sphere(block: Block) -> KindDecl | None:
    """The block's l2norm declared ``hypersphere=true``: the retraction that makes it nGPT."""
    return next((d for d in block.decls if isinstance(d, KindDecl) and d.category == "norm"
                 and d.arg("hypersphere")), None)


def _check(block: Block) -> list[Diagnostic]:
    decl = sphere(block)
    subs = wrapper(block).sublayers
    if decl is None:
        ngpt = [s for s in subs if retracted(block, s)]
        if not ngpt:
            return []
        return [error("E0431", f"'{block.name}' moves its stream on the unit sphere by normalized interpolation, "
                      "but declares no hypersphere, so its matrices are never projected back onto the sphere "
                      "after an optimizer step", ngpt[0].root.span,
                      hint=f"declare the retraction as 'l2norm({ngpt[0].root.type.last.name}, hypersphere=true)'")]
    out: list[Diagnostic] = []
    for sub in subs:
        if retracted(block, sub):
            continue
        note = [Note("the hypersphere is declared here", decl.span)]
        if sub.placement == "none":
            msg = f"this update is a plain residual add with no norm: deleting RMSNorm does not make '{block.name}' nGPT"
        else:
            msg = (f"'{block.name}' declares the hypersphere, but this update is an ordinary residual add, not a "
                   "normalized interpolation")
        out.append(error("E0430", msg, sub.root.span, notes=note, hint=f"write the nGPT update: {FORM}"))
    return out


@verifier("hypersphere")
def verify_hypersphere(program: Program) -> list[Diagnostic]:
    return [d for block in program.blocks for d in _check(block)]
