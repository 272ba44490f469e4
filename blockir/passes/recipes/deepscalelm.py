"""DeepScaleLM (Kedia et al., "Transformers Get Stable", arXiv:2403.09635): ``x_{l+1} = lambda x_l + beta F_l(x_l)`` with ``lambda^2 + beta^2 = 1``.

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
folded state dict. On a Post-LN stack ``lambda`` folds as well (:func:`skip_fold`,
:func:`unscaled_updates`): into the gains of the norms that produce the stream, with
the branches' stream-reading linears divided by it.
"""
from __future__ import annotations

from dataclasses import dataclass

from blockir.analyses.fold_legality import FIRST_LINEAR, stored_names
from blockir.analyses.structure import wrapper
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Program
from blockir.ir.traits import Calls, Normalizes, Scales
from blockir.norms import family
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
    models_stacking,
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


@dataclass(frozen=True)
class SkipFold:
    """Where lambda folds in a Post-LN DeepScaleLM block, or why it stays.

    ``N_i(lambda x + beta F_i(x))`` with ``x = N_{i-1}(...)`` is computed exactly by the stream ``x~ = lambda x``:
    ``N_{i-1}``'s affine state times lambda, the first linears of ``F_i`` reading ``x~`` divided by lambda (on
    their input columns), beta in ``F_i``'s last linear, and the model scaling the stack's input by lambda
    for the first update. The last update's norm keeps its state: nothing after the stack reads ``x~``.
    """

    norms: tuple[str, ...]  # the post norm of each update, in order
    first_linears: dict[str, tuple[str, ...]]  # branch declaration -> its layers that read the stream
    models: tuple[str, ...]  # the models whose stack input takes lambda
    reason: str | None  # why lambda stays on the shortcut (then the fields above are empty)


def _kept(reason: str) -> SkipFold:
    return SkipFold((), {}, (), reason)


def skip_fold(program: Program, block_name: str) -> SkipFold:
    """Whether lambda of ``block_name`` (the recipe's output) folds into norm gains and first linears."""
    block = program.block(block_name)
    w = wrapper(block)
    subs = w.sublayers
    if any(s.post_norm is None for s in subs):
        return _kept("a Pre-LN update scales the stream itself, which no gain reads: only each norm's epsilon "
                     "could absorb lambda (eps lambda^(-2l) at layer l), and the layers share one block")
    norms = tuple(s.post_norm.decl for s in subs)  # type: ignore[union-attr]
    applied = [op.decl for op in block.ops if op.has(Normalizes)]  # type: ignore[attr-defined]
    shared = next((n for n in norms if applied.count(n) > 1), None)
    if shared is not None:
        return _kept(f"norm '{shared}' is applied at more than one site; scaling its gain would scale them all")
    spine = [w.state_input, *(s.result for s in subs)]
    if any(s.state != spine[i] for i, s in enumerate(subs)) or w.spine[-1] != spine[-1]:
        return _kept(f"the updates of '{block_name}' do not follow one another on one stream")
    for n in norms:
        decl = block.decl_map[n]
        if not family(decl).weight(decl):
            return _kept(f"norm '{n}' has no gain to absorb lambda")
    first: dict[str, tuple[str, ...]] = {}
    for s in subs:
        decl = block.decl_map.get(getattr(s.branches[0].call, "decl", "") or "")
        assert isinstance(decl, KindDecl)  # the recipe admits built-in branches only
        if decl.arg("conv1d") or decl.arg("fused") not in (None, False, "none"):
            return _kept(f"'{decl.name}' stores its projections fused or transposed ([in, out]); dividing the "
                         "columns that read the stream needs them separate")
        first[decl.name] = stored_names(decl, FIRST_LINEAR[decl.kind][0])
    models = tuple(m.name for m in models_stacking(program, block_name))
    if not models:
        return _kept(f"no model stacks '{block_name}': the first update's lambda scales an input from outside")
    return SkipFold(norms, first, models, None)


def unscaled_updates(program: Program, block_name: str) -> Program:
    """``program`` with every update of ``block_name`` read as ``x + F(x)`` and each model stacking it scaling
    the stack's input by lambda (``skip_scale``), for a block where :func:`skip_fold` finds no reason."""
    def rewrite(p: Program) -> PassResult[None]:
        block = p.block(block_name)
        lam = next(c.value for c in block.consts if c.name == SKIP)
        edit = BlockEdit(block)
        edit.consts = [c for c in edit.consts if c.name not in ("deepscalelm", SKIP, BRANCH)]
        for op in block.ops:
            if op.has(Scales) and op.factor in (name(BRANCH), name(SKIP)):  # type: ignore[union-attr]
                edit.drop(op)
                edit.rename(op.result, op.operand)  # type: ignore[union-attr]
        models = []
        for model in models_stacking(p, block_name):
            medit = BlockEdit(model)
            medit.add_const(SKIP, lam)
            stacks = {d.name for d in model.decls if isinstance(d, InstanceDecl) and d.block == block_name}
            for op in model.ops:
                if op.has(Calls) and op.decl in stacks:  # type: ignore[attr-defined]
                    x = op.args[0]  # type: ignore[attr-defined]
                    medit.reroute(op, x, medit.scale(op, x, factor=name(SKIP)))
            models.append(medit.build())
        return PassResult(finish(replace_blocks(p, [edit.build(), *models])), True, None)
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
             ("blockir.lower.fold.fold_deepscalelm(program, block, module) moves beta into each branch's last "
              "linear for inference, and on a Post-LN stack lambda into the norm gains (the branches' first linears "
              "divided by it, the stack input times it)")]
    return RecipeResult(result, None, Report("DeepScaleLM", block_name, tuple(consts), tuple(changes), tuple(notes)))
