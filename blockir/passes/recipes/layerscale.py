"""LayerScale (CaiT, Touvron et al., 2021): ``h = x + diag(lambda) A(N(x))``, one learned channel gain per branch.

The block must be Pre-LN and stays Pre-LN. Each branch output is multiplied
by ``ls{i}.gamma: vector(D, init=eps)`` (timm's key names) right after the
branch computation, before its dropout or drop path, as in CaiT and timm.

eps follows CaiT (Touvron et al., "Going deeper with Image Transformers",
2021): "0.1 until depth 18, 1e-5 for depth 24 and 1e-6 for deeper networks".
The paper only says eps varies with the tested depth; depths 19 to 23, which
the paper does not state, take 1e-5.
"""
from __future__ import annotations

from blockir.ir.decls import KindDecl
from blockir.ir.program import Program
from blockir.passes.recipes.base import (BlockEdit, RecipeError, RecipeResult, Report, finish, num, recipe_pass,
                                  replace_blocks, stack_depths, sublayers, target_block)


def cait_eps(depth: int) -> float:
    """CaiT's initial LayerScale value for a stack of ``depth`` layers."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


def _eps(program: Program, block_name: str, eps: float | None, depth: int | None) -> tuple[float, str]:
    if eps is not None:
        return eps, "given"
    if depth is None:
        depths = stack_depths(program, block_name)
        if len(depths) != 1:
            raise RecipeError(f"'{block_name}' is stacked at depths {', '.join(map(str, depths))}; pass eps= or "
                              "depth= to choose the initial gain")
        depth = depths[0]
    return cait_eps(depth), f"CaiT rule for depth {depth}"


@recipe_pass("layerscale")
def apply(program: Program, block_name: str, *, eps: float | None = None, depth: int | None = None) -> RecipeResult:
    """LayerScale on every branch of the Pre-LN block ``block_name``.

    ``eps`` is the initial gain; by default it follows CaiT's rule for ``depth`` (default: the depth of
    the stack that instantiates the block).
    """
    block = target_block(program, block_name)
    value, why = _eps(program, block_name, eps, depth)
    width = block.result.axes[-1].name
    edit = BlockEdit(block)
    changes = []
    index = 0
    for s in sublayers(block):
        for b in s.branches:
            if s.post_norm is not None or b.out_norm is not None or not b.pre_norms:
                raise RecipeError(f"branch '{b.name}' of '{block_name}' is not Pre-LN (its input is not normalized "
                                  "or its output or sum is); LayerScale's contract keeps a Pre-LN block")
            if any(op.param is not None for op in b.scales):
                raise RecipeError(f"branch '{b.name}' of '{block_name}' is already scaled by a learned gain")
            index += 1
            gain = f"ls{index}.gamma"
            edit.add_decl(KindDecl(gain, "vector", (("axis", width), ("init", num(value)), ("offset", 0))))
            # the gain sits between the computation and its first modifier (dropout, drop path, cast)
            reader = b.modifiers[-1] if b.modifiers else next(a for a in s.adds if b.leaf in a.operands)
            output = reader.operands[0] if b.modifiers else b.leaf
            edit.reroute(reader, output, edit.scale(reader, output, param=gain))
            changes.append(f"'{b.name}': output scaled by {gain} = vector({width}, init={value:g})")
    result = finish(replace_blocks(program, [edit.build()]))
    notes = ["CaiT keeps Pre-LN and its warmup and vision training recipe; only the graph and init are here",
             "the gains may fold into the branch output projection for inference (blockir fold), not in training"]
    return RecipeResult(result, None, Report("LayerScale", block_name, ((f"eps ({why})", value),),
                                             tuple(changes), tuple(notes)))
