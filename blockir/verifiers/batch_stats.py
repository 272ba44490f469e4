"""Batch-coupled norms (BatchNorm, RepBN, PRepBN): their statistics are a contract between rows.

A BatchNorm moment is taken over every row of the batch, so padded rows that enter it change
the outputs of real tokens with the batch's length distribution: the declaration must state a
padding policy. An evaluated block (``const training = 0``) must read fixed running moments,
not each batch's own, and may not carry a PRepBN, whose LayerNorm share stays live until its
transition ends: the released graph is the converted ``batchnorm(rep=true)`` with calibrated
statistics (Guo et al., "SLAB", arXiv:2405.11582).
"""
from __future__ import annotations

from blockir.analyses.facts import stated
from blockir.norms import family
from blockir.analyses.sizes import block_env, program_env, value
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir.consts import format_expr
from blockir.ir.decls import KindDecl
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier

# argument, the values it may take, and what they mean; eps itself is the norm contract's (E0304)
_RANGES = {
    "steps": (lambda v: v >= 1 and float(v).is_integer(), "a whole number >= 1",
              "the transition length T in gamma = clip((T - t) / T, 0, 1) counts training steps"),
    "momentum": (lambda v: 0 <= v <= 1, "in [0, 1]",
                 "the running moments are (1 - momentum) * running + momentum * batch"),
    "ln_eps": (lambda v: v > 0, "> 0", "it sits inside the LayerNorm share's square root, away from zero"),
}


def _check_ranges(d: KindDecl, env: dict) -> list[Diagnostic]:
    out = []
    for name, (ok, must, why) in _RANGES.items():
        v = value(d.arg(name), env) if d.arg(name) is not None else None
        if v is not None and not ok(v):
            out.append(error("E0438", f"{name} of {d.kind} '{d.name}' is {v:g}; it must be {must}", d.span,
                             hint=why))
    return out


def _check_block(block: Block, base: dict) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    env = block_env(base, block)
    evaluated = stated(block, env).get("training")
    evaluated = evaluated if evaluated is not None and evaluated.value == 0 else None
    for d in block.decls:
        if not isinstance(d, KindDecl) or d.category != "norm" or not family(d).batch_coupled:
            continue
        out += _check_ranges(d, env)
        if d.arg("padding") is None:
            out.append(error("E0435", f"{d.kind} '{d.name}' takes its moments over every row of the batch but states "
                             "no padding policy: padded rows would shift the statistics of real tokens", d.span,
                             hint="add padding=mask (padded rows neither enter the moments nor update the running "
                                  "ones) or padding=include (the batches carry no padding)"))
        if evaluated is None:
            continue
        if not d.arg("running"):
            out.append(error("E0436", f"{d.kind} '{d.name}' has running=false in '{block.name}', which states "
                             "training = 0: evaluation would normalize each batch by its own moments, so one "
                             "example's output depends on the others", d.span,
                             notes=[Note("stated here", evaluated.const.span)],
                             hint="keep running=true and calibrate the running moments before evaluating"))
        if family(d).transitions:
            steps = format_expr(d.arg("steps"), 2)
            out.append(error("E0437", f"prepbn '{d.name}' in '{block.name}', which states training = 0: until step "
                             f"{steps} its output still mixes in LayerNorm, so its fixed-statistics form (what a fold "
                             "or a release computes) is a different function", d.span,
                             notes=[Note("stated here", evaluated.const.span)],
                             hint=f"after the transition, declare batchnorm({', '.join(d.arg('axes'))}, rep=true, "
                                  "padding=…) and calibrate its statistics before folding it"))
    return out


@verifier("batch-stats")
def verify_batch_stats(program: Program) -> list[Diagnostic]:
    env = program_env(program)
    return [d for b in program.blocks for d in _check_block(b, env)]
