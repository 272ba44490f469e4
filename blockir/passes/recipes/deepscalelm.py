"""DeepScaleLM (Shah et al., arXiv:2403.09635): ``x_{l+1} = lambda x_l + beta F_l(x_l)`` with ``lambda^2 + beta^2 = 1``.

With a unit-variance skip and branch and no covariance between them, the sum
keeps unit variance. The simplified recipe takes ``beta^2 = 2/N`` and
``lambda^2 = 1 - 2/N`` for N layers; both become block constants
(``skip_scale``, ``branch_scale``) written with the stack's N, and the block
states ``const deepscalelm = 1``, so the verifier checks the identity
(E0441). They are not functions of ``num_layers``: a block checked alone has
``num_layers = 1``, where ``1 - 2/N`` is negative.

The components are initialised so that each keeps the second moment of its
input (``init_std=fan_in`` on every branch declaration, which ``blockir.compile``
applies): Q, K, V and O from N(0, 1/fan_in), the MLP's input layers from
N(0, 2/fan_in) (a rectifying activation halves the second moment) and its
output layer from N(0, 1/fan_in), biases 0. The paper's full moment model also
tracks token correlation, dropout and the attention output scale; those terms
are not here.

:func:`blockir.lower.fold.fold_deepscalelm` moves ``beta`` into the last linear of every
branch (``beta F(x) = F'(x)`` with ``W' = beta W``, ``b' = beta b``) and returns the
program whose updates no longer scale the branch (:func:`unscaled_branches`), with the
folded state dict.
"""
from __future__ import annotations

from blockir.ir.program import Program
from blockir.ir.traits import Scales
from blockir.passes import op_kinds as K
from blockir.passes.manager import Pass, PassResult, run_pass
from blockir.passes.recipes.base import (
    BlockEdit,
    RecipeError,
    RecipeResult,
    Report,
    binop,
    finish,
    gained_branches,
    name,
    num,
    recipe_pass,
    replace_blocks,
    stack_depths,
    sublayers,
    target_block,
)

SKIP, BRANCH = "skip_scale", "branch_scale"


def constants(n: int) -> tuple[float, float]:
    """(lambda, beta) for N layers: beta^2 = 2/N, lambda^2 = 1 - 2/N."""
    return (1 - 2 / n) ** 0.5, (2 / n) ** 0.5


def unscaled_branches(program: Program, block_name: str) -> Program:
    """``program`` with every ``branch_scale * F`` of ``block_name`` read as ``F``.

    The folded block no longer states ``deepscalelm = 1``: beta now lives in the weights, so the graph alone
    no longer shows lambda^2 + beta^2 = 1.
    """
    def rewrite(p: Program) -> PassResult[None]:
        block = p.block(block_name)
        edit = BlockEdit(block)
        edit.consts = [c for c in edit.consts if c.name != "deepscalelm"]
        for op in block.ops:
            if op.has(Scales) and op.factor == name(BRANCH):  # type: ignore[union-attr]
                edit.drop(op)
                edit.rename(op.result, op.operand)  # type: ignore[union-attr]
        return PassResult(finish(replace_blocks(p, [edit.build()])), True, None)
    return run_pass(program, Pass("deepscalelm fold", rewrite)).program


@recipe_pass("deepscalelm")
def apply(program: Program, block_name: str, *, depth: int | None = None) -> RecipeResult:
    """DeepScaleLM's scaled updates and component initialisation on ``block_name`` (sequential, built-in branches)."""
    block = target_block(program, block_name)
    decls = gained_branches(block, "DeepScaleLM")
    if depth is None:
        depths = stack_depths(program, block_name)
        if len(depths) != 1:
            raise RecipeError(f"'{block_name}' is stacked at depths {', '.join(map(str, depths))}; pass depth= to "
                              "choose DeepScaleLM's N")
        depth = depths[0]
    if depth < 3:
        raise RecipeError(f"'{block_name}' is {depth} layers deep; DeepScaleLM's lambda^2 = 1 - 2/N needs N >= 3")
    edit = BlockEdit(block)
    edit.add_const("deepscalelm", num(1))
    edit.add_const(SKIP, binop("**", binop("-", num(1), binop("/", num(2), num(depth))), num(0.5)))
    edit.add_const(BRANCH, binop("**", binop("/", num(2), num(depth)), num(0.5)))
    changes = []
    for d in decls:
        edit.set_arg(d.name, "init_std", "fan_in")
        changes.append(f"'{d.name}' ({d.kind}): init_std=fan_in")
    for s in sublayers(block):
        add = s.root
        if not K.residual_add(add) or len(s.adds) != 1 or len(s.branches) != 1:
            raise RecipeError(f"DeepScaleLM scales one skip and one branch per add; the add at line {add.span.line} "
                              f"of '{block_name}' joins {len(s.branches)} branches")
        if s.shortcut != s.state or s.shortcut_ops or s.branches[0].scales:
            raise RecipeError(f"the add at line {add.span.line} of '{block_name}' already scales its shortcut or "
                              "branch; DeepScaleLM sets both")
        b = s.branches[0]
        edit.reroute(add, s.state, edit.scale(add, s.state, factor=name(SKIP)))
        edit.reroute(add, b.leaf, edit.scale(add, b.leaf, factor=name(BRANCH)))
        changes.append(f"'{b.name}': skip_scale * state + branch_scale * update")
    result = finish(replace_blocks(program, [edit.build()]))
    lam, beta = constants(depth)
    consts = ((f"lambda (N={depth})", lam), (f"beta (N={depth})", beta))
    notes = [("init_std=fan_in: Q/K/V/O and MLP output layers N(0, 1/fan_in), MLP input layers N(0, 2/fan_in), "
              "biases 0"),
             "the paper's token-correlation, dropout and attention-output terms of the moment model are not applied",
             "initialise the embeddings outside the block to unit variance",
             "blockir.lower.fold.fold_deepscalelm(program, block, module) moves beta into each branch's last "
             "linear for inference"]
    return RecipeResult(result, None, Report("DeepScaleLM", block_name, tuple(consts), tuple(changes), tuple(notes)))
