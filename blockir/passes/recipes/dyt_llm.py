"""Dynamic Tanh at LLM sites (Zhu et al., "Transformers without Normalization", arXiv:2503.10622).

``DyT(x) = weight * tanh(alpha * x) + bias`` replaces every norm of the block and
the final norm of each model that stacks it. For non-LLM models the paper
initialises alpha at 0.5 everywhere; its LLaMA experiments tune alpha by width
and by site, one value for the norm in front of attention and another for every
other norm (the FFN's and the final one):

=========================  ======  =================  =============
LLaMA                      width   alpha (attention)  alpha (other)
=========================  ======  =================  =============
7B                         4096    0.8                0.2
13B                        5120    0.6                0.15
34B, 70B                   8192    0.2                0.05
=========================  ======  =================  =============

The table (``norms.dyt.LLM_ALPHA``) only has these widths: a width up
to 4096 takes the 7B row, up to 5120 the 13B row, anything wider the 34B/70B
row. The LLaMA runs also add a
learned scalar after the embedding, initialised to sqrt(d), because the
initial activations were otherwise too small: each model that stacks the
block multiplies the stack's input by ``embed_scale: scalar(init=D ** 0.5)``.
"""
from __future__ import annotations

from blockir.norms.dyt import FAMILY as DYT, llm_alpha as dyt_llm_alpha
from blockir.analyses.sizes import block_env, program_env, value
from blockir.analyses.structure import attention_norms
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.traits import Calls
from blockir.passes.op_kinds import plain_norm
from blockir.passes.recipes.base import (BlockEdit, RecipeError, RecipeResult, Report, binop, finish, models_stacking,
                                           name, num, recipe_pass, replace_blocks, sublayers, target_block)


def _dyt(decl: KindDecl, alpha: float) -> KindDecl:
    return KindDecl(decl.name, DYT.name, (("axes", decl.arg("axes")), ("alpha", num(alpha)), ("offset", 0),
                                       ("tied", decl.arg("tied"))), decl.span)


def _width(program: Program, block: Block) -> tuple[str, int]:
    axis = block.result.axes[-1].name
    width = value(name(axis), block_env(program_env(program), block))
    if width is None:
        raise RecipeError(f"the width {axis} of '{block.name}' has no size; DyT's LLM alpha depends on it")
    return axis, int(width)


def _model(owner: Block, block_name: str, alpha: float, axis: str) -> tuple[Block, list[str]]:
    edit = BlockEdit(owner)
    changes = []
    stacks = {d.name for d in owner.decls if isinstance(d, InstanceDecl) and d.block == block_name}
    calls = [op for op in owner.ops if op.has(Calls) and op.decl in stacks]  # type: ignore[union-attr]
    for op in owner.ops:
        if plain_norm(op) and op.operand in {c.result for c in calls}:  # type: ignore[union-attr]
            decl = owner.decl_map[op.decl]
            edit.decls = [_dyt(d, alpha) if d.name == decl.name else d for d in edit.decls]
            changes.append(f"{owner.name}.{decl.name}: {decl.kind} -> dyt(alpha={alpha:g})")
    edit.add_decl(KindDecl("embed_scale", "scalar", (("init", binop("**", name(axis), num(0.5))), ("offset", 0))))
    for call in calls:
        edit.reroute(call, call.args[0], edit.scale(call, call.args[0], param="embed_scale"))
    changes.append(f"{owner.name}: stack input scaled by embed_scale = scalar(init={axis} ** 0.5)")
    return edit.build(), changes


@recipe_pass("dyt_llm")
def apply(program: Program, block_name: str, *, width: int | None = None) -> RecipeResult:
    """DyT with the LLM alpha of the block's width (or ``width``) at every norm site of ``block_name``."""
    block = target_block(program, block_name)
    axis, own = _width(program, block)
    attention, other = dyt_llm_alpha(width or own)
    sublayers(block)  # refuses a block without residual updates
    attention_ops = attention_norms(block)
    at_attention = {op.decl for op in attention_ops}
    norms = [d for d in block.decls if isinstance(d, KindDecl) and d.category == "norm"]
    if not norms:
        raise RecipeError(f"'{block_name}' has no norm for DyT to replace")
    other_sites = {op.decl for op in block.ops if plain_norm(op) and op not in attention_ops}  # type: ignore[union-attr]
    shared = at_attention & other_sites
    if shared:
        raise RecipeError(f"norm '{min(shared)}' of '{block_name}' is applied in front of attention and "
                          "elsewhere; DyT's LLM initialisation gives the two sites different alphas")
    edit = BlockEdit(block)
    changes = []
    for d in norms:
        alpha = attention if d.name in at_attention else other
        edit.decls = [_dyt(x, alpha) if x.name == d.name else x for x in edit.decls]
        where = "attention site" if d.name in at_attention else "other site"
        changes.append(f"'{d.name}': {d.kind} -> dyt(alpha={alpha:g}) ({where})")
    models = []
    for owner in models_stacking(program, block_name):
        model, lines = _model(owner, block_name, other, axis)
        models.append(model)
        changes += lines
    result = finish(replace_blocks(program, [edit.build(), *models]))
    consts = ((f"width {axis}", float(width or own)), ("alpha at attention sites", attention),
              ("alpha at other sites", other))
    notes = ["the graph changes (no row statistics): retrain; a trained norm checkpoint does not carry over",
             "weight starts at 1 and bias at 0, as in the paper"]
    if not models:
        notes.append("no model stacks the block: multiply the embedding output by a learned scalar initialised to "
                     f"sqrt({width or own})")
    return RecipeResult(result, None, Report("DyT (LLM)", block_name, consts, tuple(changes), tuple(notes)))
