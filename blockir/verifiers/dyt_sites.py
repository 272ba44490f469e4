"""DyT's alpha at LLM sites: a decoder that gives every DyT the generic alpha copies the non-LLM recipe.

Zhu et al. ("Transformers without Normalization", arXiv:2503.10622) initialise
alpha at 0.5 for non-LLM models, but their LLaMA models tune it by width and
site (the norm in front of attention and every other norm differ) and add a
learned scalar after the embedding.
"""
from __future__ import annotations

from blockir.norms.dyt import FAMILY as DYT, GENERIC_ALPHA as DYT_GENERIC_ALPHA, llm_alpha as dyt_llm_alpha
from blockir.analyses.sizes import block_env, program_env, value
from blockir.analyses.structure import attention_norms, decl_kind
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir.consts import Name
from blockir.ir.decls import KindDecl
from blockir.ir.traits import Calls, Normalizes
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier


def _causal(block: Block) -> bool:
    return any(op.has(Calls) and decl_kind(block, op) == "self_attention"
               and block.decl_map[op.decl].arg("causal") for op in block.ops)


def verify_block(block: Block, env: dict) -> list[Diagnostic]:
    if not _causal(block):
        return []
    dyts = {op.decl: block.decl_map[op.decl] for op in block.ops if op.has(Normalizes)
            and isinstance(block.decl_map.get(op.decl), KindDecl) and block.decl_map[op.decl].kind == DYT.name}
    attention_ops = attention_norms(block)
    at_attention = {op.decl for op in attention_ops} & set(dyts)
    others = {op.decl for op in block.ops if op.has(Normalizes) and op.decl in dyts and op not in attention_ops}
    if not at_attention or not others or any(value(d.arg("alpha"), env) != DYT_GENERIC_ALPHA for d in dyts.values()):
        return []
    first = dyts[min(at_attention)]
    width = value(Name(block.result.axes[-1].name), env)
    rule = ""
    if width is not None:
        a, o = dyt_llm_alpha(int(width))
        rule = f" (width {int(width)}: {a:g} in front of attention, {o:g} elsewhere)"
    return [error("E0443", f"every DyT of the causal decoder '{block.name}' starts at the generic alpha = "
                  f"{DYT_GENERIC_ALPHA:g}; the LLM recipe sets alpha by width and site{rule}", first.span,
                  notes=[Note(f"'{n}' is another site", dyts[n].span) for n in sorted(others)],
                  hint="Transformers without Normalization (arXiv:2503.10622) tunes alpha for LLMs by width and "
                       "location and adds a learned scalar after the embedding; `blockir.passes.recipes.dyt_llm` "
                       "writes both")]


@verifier("dyt_sites")
def verify_dyt_sites(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    return [d for b in program.blocks for d in verify_block(b, block_env(base, b))]
