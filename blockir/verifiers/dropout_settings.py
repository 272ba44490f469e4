"""Attention-probability dropout is not residual dropout (failure-lab bug 21).

An attention declaration's ``dropout=`` drops the attention probabilities
inside the branch; the update the branch returns still reaches the residual
add in full. A block that drops another branch's update before its add but
not the attention's, while the attention drops its probabilities, reads as
one setting taken for the other: the attention update's residual dropout is
missing. The original Transformer (Vaswani et al., 2017), BERT and GPT-2
drop every update; StableLM and DistilBERT drop only the MLP's, so this is a
warning, silenced by writing the attention update's own dropout (``p=0``
states that it has none, as the imports of those two do).
"""
from __future__ import annotations

from typing import Iterator

from blockir.analyses.dropout_owners import ATTENTION
from blockir.analyses.sizes import block_env, layer_counts, program_env, value
from blockir.analyses.structure import decl_kind, wrapper
from blockir.diagnostics import Diagnostic, Note, warning
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier


def _confused(block: Block, env: dict) -> Iterator[Diagnostic]:
    branches = [b for s in wrapper(block).sublayers for b in s.branches]
    dropped = [(b, d) for b in branches for d in b.dropouts if value(d.p, env) != 0]
    for b in branches:
        decl = block.decl_map.get(getattr(b.call, "decl", "") or "")
        if not isinstance(decl, KindDecl) or decl_kind(block, b.call) not in ATTENTION or b.dropouts:
            continue
        p = value(decl.arg("dropout"), env)
        other = next(((o, d) for o, d in dropped if o is not b), None)
        if not p or other is None:
            continue
        o, d = other
        yield warning("W0410", f"{decl.kind} '{decl.name}' drops its attention probabilities (dropout={p:g}), but "
                      f"its update reaches the residual add undropped while the update of '{o.name}' is dropped "
                      f"(p={value(d.p, env):g}): attention-probability dropout acts inside the branch, not on the "
                      "update the residual adds", b.call.span,  # type: ignore[union-attr]
                      notes=[Note(f"'{o.name}' is dropped here", d.span), Note("declared here", decl.span)],
                      hint=f"residual dropout is its own setting: write dropout({decl.name}(…), p=…) on the "
                           "attention update as well (p=0 if the architecture has none there)")


@verifier("dropout_settings")
def verify_dropout_settings(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    counts = layer_counts(program, base)
    return [d for b in program.blocks
            for d in _confused(b, block_env(base, b, 0, counts.get(b.name, (1,))[0]))]
