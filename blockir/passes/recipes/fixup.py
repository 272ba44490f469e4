"""Fixup (Zhang et al., "Fixup Initialization: Residual Learning Without Normalization", arXiv:1901.09321).

For L residual branches of m weight layers each, the contract is:

1. remove every normalization layer (and the stack's final norm);
2. zero-initialise the last weight layer of every branch;
3. rescale the other weight layers of every branch by L^(-1/(2m-2)) after
   their standard initialisation;
4. add a scalar multiplier (init 1) to every branch and a scalar bias
   (init 0) before each weight layer and element-wise activation.

The graph carries 1 and 4: each update becomes
``x + fixup_scale{i} * F(x + fixup_bias{i}a) + fixup_bias{i}b``, and every branch
declaration gets ``fixup_bias=true``: the scalar biases between its layers
(before an MLP's activation and its output layer, before attention's output
projection) are the module's own parameters. 2 and 3 are the branch
declarations' ``init_zero=true`` and ``init_scale=fixup_rescale``, which
``blockir.compile`` applies. A built-in branch is m = 2 layers deep
along the path its update takes: V then O for attention, fc1 (gate/up) then
fc2 (down) for an MLP; Q and K only form the mixing weights and keep their
initialisation. L counts every branch of the stack: branches per block times
the stack depth.
"""
from __future__ import annotations

from blockir.ir import consts as C
from blockir.ir.decls import KindDecl
from blockir.ir.init_roles import PATH_LAYERS
from blockir.ir.program import Program
from blockir.ir.traits import Calls
from blockir.passes import op_kinds as K
from blockir.passes.recipes.base import (BlockEdit, RecipeError, RecipeResult, Report, binop, finish, gained_branches,
                                           name, num, recipe_pass, remove_all_norms, replace_blocks, stack_depths,
                                           sublayers, target_block)


def rescale(branches: int, weight_layers: int = PATH_LAYERS) -> float:
    """Fixup's factor L^(-1/(2m-2)) for the non-final layers of every branch."""
    return branches ** (-1 / (2 * weight_layers - 2))


@recipe_pass("fixup")
def apply(program: Program, block_name: str, *, depth: int | None = None) -> RecipeResult:
    """Fixup on ``block_name``; ``depth`` is the stack depth L is counted over (default: the stack's)."""
    block = target_block(program, block_name)
    decls = gained_branches(block, "Fixup")
    fused = [d.name for d in decls if d.arg("fused") not in (None, False, "none")
             and d.kind.endswith("attention")]
    if fused:
        raise RecipeError(f"attention '{fused[0]}' stores q, k and v as one matrix; Fixup rescales the value "
                          "projection alone, so declare it with fused=none")
    given = depth
    if depth is None:
        depths = stack_depths(program, block_name)
        if len(depths) != 1:
            raise RecipeError(f"'{block_name}' is stacked at depths {', '.join(map(str, depths))}; pass depth= to "
                              "count Fixup's L")
        depth = depths[0]
    edit = BlockEdit(block)
    edit.add_const("fixup", num(1))
    per_block = sum(len(s.branches) for s in sublayers(block))
    # L follows the stack the block is compiled in unless the caller fixes it
    layers = name(C.NUM_LAYERS) if given is None else num(given)
    edit.add_const("fixup_rescale", binop("**", binop("*", num(per_block), layers),
                                          num(-1 / (2 * PATH_LAYERS - 2))))
    changes = []
    for d in decls:
        edit.set_arg(d.name, "init_scale", name("fixup_rescale"))
        edit.set_arg(d.name, "init_zero", True)
        edit.set_arg(d.name, "fixup_bias", True)
        changes.append(f"'{d.name}' ({d.kind}): init_scale=fixup_rescale, init_zero=true, fixup_bias=true")
    index = 0
    for s in sublayers(block):
        for b in s.branches:
            if any(op.param is not None for op in b.scales):
                raise RecipeError(f"branch '{b.name}' of '{block_name}' is already gated by a learned scale")
            index += 1
            bias_in, gate, bias_out = f"fixup_bias{index}a", f"fixup_scale{index}", f"fixup_bias{index}b"
            edit.add_decl(KindDecl(bias_in, "bias", (("init", num(0.0)),)))
            edit.add_decl(KindDecl(gate, "scalar", (("init", num(1.0)), ("offset", 0))))
            edit.add_decl(KindDecl(bias_out, "bias", (("init", num(0.0)),)))
            call = b.call
            assert call is not None and call.has(Calls)  # gained_branches admits built-in branches only
            operand = call.args[0]
            shifted = edit.fresh()
            edit.insert_before(call, K.bias(shifted, block.type_of(operand), operand, bias_in))
            edit.reroute(call, operand, shifted)
            add = next(a for a in s.adds if b.leaf in a.operands)
            scaled = edit.scale(add, b.leaf, param=gate)
            out = edit.fresh()
            edit.insert_before(add, K.bias(out, block.type_of(b.leaf), scaled, bias_out))
            edit.reroute(add, b.leaf, out)
            changes.append(f"'{b.name}': input + {bias_in}, output * {gate} + {bias_out}")
    models, removed = remove_all_norms(program, block_name, block, edit)
    changes += removed
    result = finish(replace_blocks(program, [edit.build(), *models]))
    branches = index * depth
    factor = rescale(branches)
    consts = ((f"L (branches in a {depth}-layer stack)", float(branches)), ("m (weight layers per branch)", 2.0),
              ("rescale L^(-1/(2m-2))", factor))
    notes = [("compile zeroes o_proj/fc2/down_proj (init_zero) and rescales v_proj/fc1/gate_proj/up_proj "
              "(init_scale); Q and K keep their initialisation"),
             ("fixup_bias=true gives each branch the scalar biases between its weight layers: before the MLP's "
              "activation and before its output layer, before the attention's output projection"),
             ("zero-initialise the classifier (outside the block); the paper trains with mixup regularization — "
              "neither is part of the graph")]
    return RecipeResult(result, None, Report("Fixup", block_name, consts, tuple(changes), tuple(notes)))
