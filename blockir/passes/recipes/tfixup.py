"""T-Fixup (Huang et al., 2020): initialisation replaces normalization in an encoder–decoder Transformer.

For N encoder and N decoder layers: Xavier-initialise everything but the
embeddings; scale decoder V/O attention matrices (self- and cross-attention)
and decoder MLP weights by (9N)^(-1/4), encoder V/O and MLP weights by
0.67 N^(-1/4); remove every LayerNorm, including the stack's final one; train
without warmup. Q and K are not scaled.

The gains become ``init_gain=gain`` on the branch declarations with
``const gain`` a function of ``num_layers``: Xavier-normal with that gain on
v_proj/o_proj and the MLP matrices, gain 1 on q_proj/k_proj. The token embedding
of each model stacking the block is drawn from N(0, d^(-1/2)) and scaled by
(9N)^(-1/4) (``init_std``, ``init_gain`` on its declaration, N the depth of
that model's stack); the report repeats the gain for an embedding outside the
program. The block states ``const tfixup = 1``, which the verifier checks
(E0445): no norm, and every branch's gain the scale of its side at the stack's
depth.
"""
from __future__ import annotations

from blockir.analyses.key_roles import token_table
from blockir.analyses.tfixup import SIDES, gains
from blockir.ir import consts as C
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.passes.recipes.base import (
    BlockEdit,
    RecipeError,
    RecipeResult,
    Report,
    binop,
    finish,
    gained_branches,
    has_cross_attention,
    name,
    num,
    recipe_pass,
    remove_all_norms,
    replace_blocks,
    stack_depths,
    target_block,
)

NUM_LAYERS = name(C.NUM_LAYERS)


def _gain_expr(side: str) -> C.ConstExpr:
    if side == "decoder":
        return binop("**", binop("*", num(9), NUM_LAYERS), num(-0.25))
    return binop("*", num(0.67), binop("**", NUM_LAYERS, num(-0.25)))


def embedding_gain(layers: C.ConstExpr) -> C.ConstExpr:
    """``(9N)^(-1/4)``: the input embeddings' scale, on the encoder side as on the decoder's."""
    return binop("**", binop("*", num(9), layers), num(-0.25))


def _scaled_embeddings(models: list[Block], block_name: str) -> tuple[list[Block], list[str]]:
    """Each model's token embedding drawn from N(0, d^(-1/2)) and scaled by (9N)^(-1/4), N its stack's depth."""
    out, changes = [], []
    for model in models:
        table = token_table(model)
        stack = next(d for d in model.decls if isinstance(d, InstanceDecl) and d.block == block_name)
        if table is None or stack.count is None:
            out.append(model)
            continue
        decl = model.decl_map[table]
        assert isinstance(decl, KindDecl)
        edit = BlockEdit(model)
        edit.set_arg(table, "init_std", binop("**", name(decl.arg("width")), num(-0.5)))
        edit.set_arg(table, "init_gain", embedding_gain(stack.count))
        out.append(edit.build())
        changes.append(f"'{model.name}.{table}' (embedding): init_std={decl.arg('width')} ** -0.5, "
                       f"init_gain=(9N)^(-1/4) with N the depth of '{stack.name}'")
    return out, changes


@recipe_pass("tfixup")
def apply(program: Program, block_name: str, *, side: str | None = None) -> RecipeResult:
    """T-Fixup on ``block_name``, the encoder or decoder layer (default: decoder when it has cross-attention)."""
    block = target_block(program, block_name)
    side = side or ("decoder" if has_cross_attention(block) else "encoder")
    if side not in SIDES:
        raise RecipeError(f"unknown side '{side}'; expected encoder or decoder")
    edit = BlockEdit(block)
    edit.add_const("tfixup", num(1))
    edit.add_const("gain", _gain_expr(side))
    changes = []
    for decl in gained_branches(block, "T-Fixup"):
        edit.set_arg(decl.name, "init_gain", name("gain"))
        changes.append(f"'{decl.name}' ({decl.kind}): init_gain=gain")
    models, removed_lines = remove_all_norms(program, block_name, block, edit)
    changes += removed_lines
    models, embedded = _scaled_embeddings(models, block_name)
    changes += embedded
    result = finish(replace_blocks(program, [edit.build(), *models]))
    consts = []
    for depth in stack_depths(program, block_name):
        consts.append((f"{side} gain (num_layers={depth})", gains(depth)[side]))
        consts.append((f"embedding gain (num_layers={depth})", gains(depth)["decoder"]))
    notes = ["the paper's N counts encoder and decoder layers alike; each side here uses its own stack depth",
             ("a model stacking the block has its token embedding drawn from N(0, d^(-1/2)) and scaled by the "
              "embedding gain (init_std, init_gain); an embedding outside the program takes them by hand"),
             "train without learning-rate warmup; the constants are the paper's NMT contract, not a decoder-only "
             "recipe"]
    return RecipeResult(result, None, Report("T-Fixup", block_name, tuple(consts), tuple(changes), tuple(notes)))
