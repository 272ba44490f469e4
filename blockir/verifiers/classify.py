"""Declared facts and consistent placement: the verifier half of topology classification.

A block that states ``norm_first`` or ``parallel_residual`` must be wired that
way; a block that states neither must normalize every update the same way.
"""
from __future__ import annotations

from blockir.analyses.classify import match_registry, normformer_missing, placements
from blockir.analyses.sizes import block_env, program_env
from blockir.analyses.facts import FACTS, stated
from blockir.analyses.structure import Sublayer, Wrapper, normalized_shortcut, wrapper
from blockir.analyses.summaries import output_source
from blockir.diagnostics import Diagnostic, Note, Span, error, warning
from blockir.ir.traits import Normalizes
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier


def _branch_names(s: Sublayer) -> str:
    return ", ".join(f"'{b.name}'" for b in s.branches)


def _mixed(block: Block, w: Wrapper) -> Diagnostic | None:
    placed = placements(block, w)
    if len(set(placed)) < 2 or any(not b.ops for s in w.sublayers for b in s.branches) \
            or any(normalized_shortcut(block, s) is not None for s in w.sublayers):
        return None  # an empty update (a shape error) or a normalized shortcut (E0412) is reported on its own
    first = w.sublayers[0]
    odd, odd_placement = next((s, p) for s, p in zip(w.sublayers, placed) if p != placed[0])
    return warning("W0401", f"updates of '{block.name}' disagree on norm placement: {_branch_names(first)} is "
                   f"{placed[0]}, {_branch_names(odd)} is {odd_placement}", odd.root.span,
                   notes=[Note("the first update", first.root.span)],
                   hint="a norm's name does not place it (LLaMA's post_attention_layernorm is the MLP's pre-norm); "
                        "normalize every update the same way, or state the intended order with `const norm_first`")


def _normformer(block: Block, w: Wrapper, stated_at: Span | None) -> list[Diagnostic]:
    """A block wired or stated as NormFormer lacks none of its parts (one post-attention norm is not NormFormer)."""
    notes = [Note("stated here", stated_at)] if stated_at is not None else []
    return [error("E0440", f"'{block.name}' is NormFormer but lacks {what}", s.root.span, notes=notes,
                  hint="NormFormer (arXiv:2110.09456) keeps Pre-LN and adds per-head attention scales, a norm on "
                       "the attention output and a norm after the FFN's first projection and activation; all "
                       "three are the method")
            for what, s in normformer_missing(block, w)]


def _fact_problem(name: str, block: Block, w: Wrapper) -> tuple[str, Sublayer] | None:
    """What contradicts a stated fact (description, offending update), if anything."""
    for s in w.sublayers:
        if name == "norm_first=1" and ("pre" not in s.placement or "post" in s.placement):
            return "normalizes the residual sum" if "post" in s.placement else "does not normalize the branch input", s
        if name == "norm_first=0" and "post" not in s.placement:
            return "leaves the residual sum unnormalized", s
        if name == "parallel_residual=0" and len(s.branches) > 1:
            return f"joins {len(s.branches)} branches in one add", s
    if name == "residual_from_norm=1" and not any(normalized_shortcut(block, s) for s in w.sublayers) \
            and not _hands_on_normalized(block, w):
        return "continues from an un-normalized state, as every update of the block does", w.sublayers[0]
    if name == "parallel_residual=1" and not (len(w.sublayers) == 1 and len(w.sublayers[0].branches) > 1):
        return "updates the state one branch after another", w.sublayers[0]
    return None


def _hands_on_normalized(block: Block, w: Wrapper) -> bool:
    """A layer whose result is a norm's output while its first update continues its input un-normalized: in a
    stack, each layer then continues the previous layer's normalized result."""
    _, out = output_source(block)
    first = w.sublayers[0]
    return out is not None and out.has(Normalizes) and bool(block.params) and first.post_norm is None \
        and first.state == block.params[0].name


MEANING = {"norm_first=1": "Pre-LN: every branch reads a normalized state",
           "norm_first=0": "Post-LN: every residual sum is normalized",
           "parallel_residual=1": "all branches read the same state and join one add",
           "parallel_residual=0": "branches update the state one after another",
           "residual_from_norm=1": "an update continues the stream from a normalized value"}
# residual_from_norm = 0 needs no check of its own: an unstated normalized shortcut is E0412
CHECKED = ("norm_first", "parallel_residual", "residual_from_norm")


def verify_block(block: Block, base: dict) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    w = wrapper(block)
    facts = stated(block, block_env(base, block))
    for fact in facts.values():
        if not fact.valid:
            out.append(error("E0408", f"'{fact.name}' states a fact and must be 0 or 1, got {fact.value}",
                             fact.const.span, hint="reserved constants: " + ", ".join(FACTS)))
    for fact in (f for f in facts.values() if f.valid and f.name in CHECKED):
        key = f"{fact.name}={int(fact.value or 0)}"
        problem = _fact_problem(key, block, w) if w.sublayers and key in MEANING else None
        if problem is not None:
            what, sub = problem
            out.append(error("E0407", f"'{block.name}' states {key.replace('=', ' = ')} ({MEANING[key]}), but "
                             f"this update {what}", sub.root.span, notes=[Note("stated here", fact.const.span)],
                             hint="the order of norms, branches and adds is the architecture: the same tensors "
                                  "wired another way are another model; fix the equations or the stated fact"))
    claimed = "normformer" in facts and facts["normformer"].value == 1
    if claimed or (w.sublayers and match_registry(w) == "normformer"):
        out += _normformer(block, w, facts["normformer"].const.span if claimed else None)
    elif "norm_first" not in facts:
        d = _mixed(block, w)
        if d is not None:
            out.append(d)
    return out


@verifier("classify")
def verify_classification(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    return [d for b in program.blocks for d in verify_block(b, base)]
