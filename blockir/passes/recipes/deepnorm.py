"""DeepNorm (DeepNet, Wang et al., 2022): ``x_{l+1} = LN(alpha * x_l + G_l(x_l))`` with init gain beta.

alpha scales the shortcut inside every Post-LN sum (Pre-LN sublayers are
moved to Post-LN); beta is the Xavier gain of the value/output projections
and the MLP matrices (``init_gain`` on the branch declarations), Q and K keep
gain 1. Both are block constants of ``num_layers``, so they follow the depth
of the stack the block is compiled in. The architecture table:

    encoder-only, N layers     alpha = (2N)^(1/4)             beta = (8N)^(-1/4)
    decoder-only, M layers     alpha = (2M)^(1/4)             beta = (8M)^(-1/4)
    encoder-decoder, encoder   alpha = 0.81 (N^4 M)^(1/16)    beta = 0.87 (N^4 M)^(-1/16)
    encoder-decoder, decoder   alpha = (3M)^(1/4)             beta = (12M)^(-1/4)
"""
from __future__ import annotations

from blockir.ir import consts as C
from blockir.ir.program import Block, Program
from blockir.norms.layernorm import FAMILY as LAYERNORM
from blockir.passes.recipes.base import (BlockEdit, RecipeError, RecipeResult, Report, binop, drop_final_norms, finish,
                                  gained_branches, has_cross_attention, name, num, recipe_pass, replace_blocks,
                                  scaled_post_ln, stack_depths, sublayers, target_block)

ARCHITECTURES = ("encoder-only", "decoder-only", "encoder-decoder")
NUM_LAYERS = name(C.NUM_LAYERS)


def constants(arch: str, n: int, m: int, side: str = "decoder") -> tuple[float, float]:
    """(alpha, beta) of the DeepNet table for N encoder and M decoder layers; ``side`` picks the
    encoder or decoder row of an encoder–decoder."""
    if arch == "encoder-only":
        return (2 * n) ** 0.25, (8 * n) ** -0.25
    if arch == "decoder-only":
        return (2 * m) ** 0.25, (8 * m) ** -0.25
    if side == "encoder":
        return 0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)
    return (3 * m) ** 0.25, (12 * m) ** -0.25


def _quarter(k: int, sign: float) -> C.ConstExpr:
    return binop("**", binop("*", num(k), NUM_LAYERS), num(sign * 0.25))


def _encoder_side(m: int) -> tuple[C.ConstExpr, C.ConstExpr]:
    depth = binop("*", binop("**", NUM_LAYERS, num(4)), num(m))
    return (binop("*", num(0.81), binop("**", depth, num(0.0625))),
            binop("*", num(0.87), binop("**", depth, num(-0.0625))))


def _decoder_layers(program: Program, block_name: str, given: int | None) -> int:
    if given is not None:
        return given
    decoders = {n for b in program.blocks if b.name != block_name and has_cross_attention(b)
                for n in stack_depths(program, b.name)}
    if len(decoders) != 1:
        raise RecipeError("the encoder row of an encoder–decoder needs the decoder depth M: pass decoder_layers=M "
                          f"(found {len(decoders)} decoder stack depths in the program)")
    return decoders.pop()


def _expressions(program: Program, block: Block, arch: str, decoder_layers: int | None
                 ) -> tuple[C.ConstExpr, C.ConstExpr, str, int]:
    """(alpha, beta, table row, M) as expressions of ``num_layers`` (M is a number on the encoder row)."""
    if arch == "encoder-decoder" and not has_cross_attention(block):
        m = _decoder_layers(program, block.name, decoder_layers)
        alpha, beta = _encoder_side(m)
        return alpha, beta, "encoder", m
    if arch == "encoder-decoder":
        return _quarter(3, 1), _quarter(12, -1), "decoder", 0
    if has_cross_attention(block):
        raise RecipeError(f"'{block.name}' reads encoder memory through cross-attention: it is the decoder of an "
                          "encoder–decoder, whose DeepNorm row is (3M)^(1/4), (12M)^(-1/4); use "
                          "arch='encoder-decoder'")
    return _quarter(2, 1), _quarter(8, -1), arch, 0


@recipe_pass("deepnorm")
def apply(program: Program, block_name: str, *, arch: str, decoder_layers: int | None = None) -> RecipeResult:
    """DeepNorm on ``block_name`` for ``arch`` (one of ARCHITECTURES).

    ``decoder_layers`` is M for the encoder side of an encoder–decoder (default: the depth of the
    program's decoder stack). Models stacking a Pre-LN block lose their final norm: the Post-LN stack
    already ends normalized.
    """
    if arch not in ARCHITECTURES:
        raise RecipeError(f"unknown architecture '{arch}'; expected one of {', '.join(ARCHITECTURES)}")
    block = target_block(program, block_name)
    alpha, beta, row, m = _expressions(program, block, arch, decoder_layers)
    edit = BlockEdit(block)
    edit.add_const("alpha", alpha)
    edit.add_const("beta", beta)
    subs = sublayers(block)
    changes = [scaled_post_ln(edit, s, "DeepNorm", factor=name("alpha")) for s in subs]
    for decl in gained_branches(block, "DeepNorm"):
        edit.set_arg(decl.name, "init_gain", name("beta"))
        changes.append(f"'{decl.name}' ({decl.kind}): init_gain=beta")
    converted = any(s.post_norm is None for s in subs)  # Pre-LN sublayers became Post-LN
    models, removed = drop_final_norms(program, block_name) if converted else ([], [])
    changes += [f"removed the final norm {r}: the Post-LN stack ends normalized" for r in removed]
    result = finish(replace_blocks(program, [edit.build(), *models]))
    consts = []
    for depth in stack_depths(program, block_name):
        a, b = constants(arch, depth, m or depth, row)
        consts += [(f"alpha (num_layers={depth})", a), (f"beta (num_layers={depth})", b)]
    notes = ["Xavier-normal init first, then beta on v_proj/o_proj and the MLP matrices; q_proj/k_proj keep gain 1",
             "the paper trains with Adam and its own warmup schedule; neither is part of the graph"]
    if any(d.kind != LAYERNORM.name for d in block.decls if getattr(d, "category", "") == "norm"):
        notes.append("DeepNet uses LayerNorm; this block's norms keep their declared family")
    return RecipeResult(result, None, Report("DeepNorm", block_name, tuple(consts), tuple(changes), tuple(notes)))
