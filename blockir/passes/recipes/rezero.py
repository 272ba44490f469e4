"""ReZero (Bachlechner et al., 2020): ``x_{l+1} = x_l + g_l * F_l(x_l)``, each gate a learned scalar initialised to 0.

At initialisation every layer is the identity (the state Jacobian is I) while
each gate still receives the gradient <dL/dx_{l+1}, F_l(x_l)>. The paper's
contract also removes normalization: with ``remove_norms=True`` (the default)
every norm of the block goes, and so does the final norm of each model that
stacks it; with ``remove_norms=False`` the gates are added to the graph as it
is, a related engineering variant, not the paper.

One gate per branch (``resweight_1``, ``resweight_2``, …, in sublayer order),
applied after the branch's dropout, where the add reads the update.
"""
from __future__ import annotations

from blockir.ir.decls import KindDecl
from blockir.ir.program import Program
from blockir.passes.recipes.base import (
    BlockEdit,
    RecipeError,
    RecipeResult,
    Report,
    finish,
    num,
    recipe_pass,
    remove_all_norms,
    replace_blocks,
    sublayers,
    target_block,
)


@recipe_pass("rezero")
def apply(program: Program, block_name: str, *, remove_norms: bool = True) -> RecipeResult:
    """ReZero gates on every branch of ``block_name``; ``remove_norms`` follows the paper (see the module doc)."""
    block = target_block(program, block_name)
    edit = BlockEdit(block)
    changes = []
    index = 0
    for s in sublayers(block):
        for b in s.branches:
            if b.scales and any(op.param is not None for op in b.scales):
                raise RecipeError(f"branch '{b.name}' of '{block_name}' is already gated by a learned scale")
            index += 1
            gate = f"resweight_{index}"
            edit.add_decl(KindDecl(gate, "scalar", (("init", num(0.0)), ("offset", 0))))
            add = next(a for a in s.adds if b.leaf in a.operands)  # the add of the sum tree reading this update
            edit.reroute(add, b.leaf, edit.scale(add, b.leaf, param=gate))
            changes.append(f"'{b.name}': update gated by {gate} = scalar(init=0)")
    models = []
    if remove_norms:
        models, removed_lines = remove_all_norms(program, block_name, block, edit)
        changes += removed_lines
    result = finish(replace_blocks(program, [edit.build(), *models]))
    notes = ["paper contract: no normalization anywhere" if remove_norms else
             "norms kept: a ReZero-gated variant of the block, not the paper's normalization-free contract",
             "gates start at 0, so every branch's own parameters get no gradient until its gate moves"]
    return RecipeResult(result, None, Report("ReZero", block_name, (("gate init", 0.0),), tuple(changes),
                                             tuple(notes)))
