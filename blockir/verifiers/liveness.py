"""Liveness verifier: a user-asserted ``@inplace`` add must be legal in the modes the block runs in."""
from __future__ import annotations

from blockir.analyses.sizes import block_env, program_env
from blockir.analyses.facts import stated
from blockir.analyses.liveness import AddDecision, plan
from blockir.diagnostics import Diagnostic, Note, error, warning
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier


def verify_block(block: Block, env: dict) -> list[Diagnostic]:
    asserted = [op for op in block.ops if op.asserts_inplace()]
    if not asserted:
        return []
    infer, train = plan(block, "infer"), plan(block, "train")
    fact = stated(block, env).get("training")
    out: list[Diagnostic] = []
    for op in asserted:
        d = infer.decision(op.result)
        if not d.inplace:
            out.append(_illegal(block, d))
            continue
        t = train.decision(op.result)
        if t.inplace or fact is not None and fact.value == 0:
            continue
        message = f"@inplace '{op.result}' would overwrite '{t.target}', but {t.reason}"
        note = [Note("saved here", t.blocker.span)] if t.blocker is not None else []
        if fact is not None and fact.value == 1:
            out.append(error("E0504", message, op.span, notes=note + [Note("stated here", fact.const.span)],
                             hint="the block states training = 1: drop @inplace, or recompute the saved value"))
        else:
            out.append(warning("W0501", message + " in training", op.span, notes=note,
                               hint="it is in place only in inference; state `const training = 0` if the block is "
                                    "never trained, or drop @inplace"))
    return out


def _illegal(block: Block, d: AddDecision) -> Diagnostic:
    message = f"@inplace '{d.result}' cannot overwrite '{d.target}': {d.reason}"
    notes = [Note(_NOTES[d.kind], d.blocker.span)] if d.blocker is not None and d.kind in _NOTES else []
    code, hint = _CODES[d.kind or "read"]
    return error(code, message, d.op.span, notes=notes, hint=hint)


_NOTES = {"read": "read here", "alias": "produced here"}
_CODES = {
    "read": ("E0501", "a later op still needs the old value: drop @inplace, or move that read before the add"),
    "alias": ("E0502", "writing over one operand while reading a view of it corrupts the sum; drop @inplace"),
    "dtype": ("E0503", "an in-place result keeps the storage dtype; cast explicitly or drop @inplace"),
}


@verifier("liveness")
def verify_liveness(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    return [d for b in program.blocks for d in verify_block(b, block_env(base, b))]
