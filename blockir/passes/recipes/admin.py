"""Admin (Liu et al., 2020): Post-LN with a profiled shortcut vector, ``x_i = LN(omega_i * x_{i-1} + F_i(x_{i-1}))``.

The graph: every sublayer becomes Post-LN (a Pre-LN one has its norm moved
behind the sum, as for DeepNorm) with ``omega_i: vector(D, init=1)`` on the
shortcut. The topology verifier warns (W0402) that such a shortcut is a
trained scale, not the identity: for Admin that is the contract.

The initialisation is data-dependent, so it is not in the IR. The profile is a
run, which the lifecycle owns (:mod:`blockir.lifecycle.admin`: its ``init(module)``
sets every omega to 1, runs the calibration batch forward in eval mode, no
dropout, through :func:`blockir.trace`, and records Var(F_j), the variance over
all elements of each branch output); this module names the sites it measures
(:func:`plan`) and turns the measured variances into the omegas:

    omega_i = sqrt(Var(x_0) + sum_{j<i} Var(F_j))

in execution order over the whole stack. The stack input x_0 is the j = 0
term: with the paper's sum alone omega_1 would be 0 and the first sublayer
would lose its shortcut (the reference implementation fixes omega_1 = 1 and
accumulates Var(x_0) + Var(F_1) + ... from there). The profile is one pass
with every omega at 1, as the method states (the reference sets each omega
while its pass proceeds).

After training, the lifecycle's ``init.fold(module)`` applies the paper's reparameterization:
omega_i multiplies x_{i-1} = LN_{i-1}(b), so it folds into that norm's affine
state (gamma' = omega gamma, beta' = omega beta) while the branch, which read
the unscaled x_{i-1}, divides the input columns of its first linears by omega
(W' = W diag(1/omega)); omega_i becomes 1 and the function is unchanged. It is
legal only where the previous norm has affine state, is applied at one site and
feeds nothing else, and the branch starts with linears blockir owns; the first
sublayer of a stack never folds inside it (its input comes from outside).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from blockir.analyses.fold_legality import FIRST_LINEAR
from blockir.norms import family
from blockir.analyses.sizes import block_env, program_env, value
from blockir.analyses.structure import Sublayer, decl_kind, wrapper
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.program import Block, Program
from blockir.ir.traits import Calls, Scales
from blockir.passes.op_kinds import plain_norm
from blockir.passes.recipes.base import (
    BlockEdit,
    RecipeError,
    RecipeResult,
    Report,
    drop_final_norms,
    finish,
    models_stacking,
    num,
    recipe_pass,
    replace_blocks,
    scaled_post_ln,
    sublayers,
    target_block,
)

PROFILE_TOKENS = 8192  # the paper profiles on no more than this many tokens


@dataclass(frozen=True)
class Site:
    """One sublayer instance of the compiled module, in execution order."""

    omega: str  # parameter path, e.g. "layers.3.omega_2"
    branch: str  # traced value path of the branch output F_i
    norm: str | None  # module path of the norm whose output omega_i scales, when omega_i folds
    linears: tuple[str, ...]  # module paths of the branch's first linears (they read that output)
    reason: str | None  # why omega_i does not fold, when it does not


@dataclass(frozen=True)
class Profile:
    input_variance: float
    variances: tuple[float, ...]  # Var(F_i) per site
    omega: tuple[float, ...]  # omega_i per site
    tokens: int


def omegas(input_variance: float, variances: Sequence[float]) -> tuple[float, ...]:
    """omega_i = sqrt(Var(x_0) + sum_{j<i} Var(F_j)), in execution order."""
    out, total = [], input_variance
    for v in variances:
        out.append(total ** 0.5)
        total += v
    return tuple(out)


# --- the graph ---------------------------------------------------------------------------------------

def _rewrite(program: Program, block: Block) -> tuple[Program, list[str]]:
    edit = BlockEdit(block)
    width = block.result.axes[-1].name
    changes = []
    subs = sublayers(block)
    for i, s in enumerate(subs, 1):
        omega = f"omega_{i}"
        edit.add_decl(KindDecl(omega, "vector", (("axis", width), ("init", num(1.0)), ("offset", 0))))
        changes.append(scaled_post_ln(edit, s, "Admin", param=omega) + f", by {omega} = vector({width}, init=1)")
    converted = any(s.post_norm is None for s in subs)  # Pre-LN sublayers became Post-LN
    models, removed = drop_final_norms(program, block.name) if converted else ([], [])
    changes += [f"removed the final norm {r}: the Post-LN stack ends normalized" for r in removed]
    return finish(replace_blocks(program, [edit.build(), *models])), changes


# --- sites of the compiled module -----------------------------------------------------------------------

def _omega_of(s: Sublayer) -> str:
    return next(op.param for op in s.shortcut_ops if op.has(Scales) and op.param is not None)  # type: ignore[union-attr]


def _fold_target(block: Block, s: Sublayer, norm: KindDecl | None, prefix: str) -> tuple[tuple[str, ...], str | None]:
    """(first-linear paths, None) when omega folds, else ((), the reason)."""
    b = s.branches[0]
    kind = decl_kind(block, b.call) if b.call is not None else None
    if norm is None:
        return (), "it scales the stack input, which no norm inside the module produces"
    if family(norm).scale(norm) != "per_channel":
        return (), f"the norm '{norm.name}' ({norm.kind}) has no per-channel affine state to absorb a vector"
    if norm.arg("tied"):
        return (), f"the norm '{norm.name}' is tied: scaling it changes every site"
    if kind not in FIRST_LINEAR or b.call is None or not b.call.has(Calls) or b.call.args[0] != s.state:
        return (), f"the branch '{b.name}' does not start with a linear blockir owns"
    readers = {id(op) for op in block.users.get(s.state, ())}
    if readers != {id(op) for op in s.shortcut_ops} | {id(b.call)}:
        return (), f"the state {s.state} feeds more than this sublayer's shortcut and branch"
    names = FIRST_LINEAR[kind][0]
    return tuple(f"{prefix}{b.call.decl}" + (f".{n}" if n else "") for n in names), None


def _block_sites(block: Block, prefix: str, incoming: KindDecl | None, incoming_path: str | None) -> list[Site]:
    out = []
    for s in wrapper(block).sublayers:
        producer = block.producers.get(s.state)
        if producer is not None and plain_norm(producer):
            decl, path = block.decl_map[producer.decl], prefix + producer.decl
        else:
            decl, path = incoming, incoming_path
        assert decl is None or isinstance(decl, KindDecl)
        linears, reason = _fold_target(block, s, decl, prefix)
        out.append(Site(prefix + _omega_of(s), prefix + s.branches[0].leaf, path if reason is None else None,
                        linears, reason))
    return out


def _last_norm(block: Block) -> KindDecl | None:
    out = block.output
    op = block.producers.get(out.value) if out is not None else None
    decl = block.decl_map.get(op.decl) if op is not None and plain_norm(op) else None  # type: ignore[union-attr]
    feeds_only_output = out is not None and len(block.users.get(out.value, ())) == 1
    return decl if isinstance(decl, KindDecl) and feeds_only_output else None


def _sites(program: Program, target: Block, admin: Block) -> tuple[Site, ...]:
    if target.name == admin.name:
        return tuple(_block_sites(admin, "", None, None))
    env = block_env(program_env(program), target)
    last = _last_norm(admin)
    out: list[Site] = []
    for op in target.ops:
        decl = target.decl_map.get(getattr(op, "decl", "") or "")
        if not op.has(Calls) or not isinstance(decl, InstanceDecl) or decl.block != admin.name:
            continue
        n = 1 if decl.count is None else int(value(decl.count, env) or 0)
        prefixes = [f"{decl.name}."] if decl.count is None else [f"{decl.name}.{k}." for k in range(n)]
        previous: str | None = None
        for p in prefixes:  # each layer's input is the previous layer's output, its last norm
            out += _block_sites(admin, p, last if previous else None, previous)
            previous = p + last.name if last is not None else None
    return tuple(out)


def _target(program: Program, block_name: str, model: str | None) -> Block:
    if model is not None:
        if model not in program.block_map:
            raise RecipeError(f"no block named '{model}'")
        return program.block(model)
    owners = models_stacking(program, block_name)
    if len(owners) > 1:
        raise RecipeError(f"'{block_name}' is used by {', '.join(b.name for b in owners)}; pass model= to choose the "
                          "module whose stack is profiled")
    return owners[0] if owners else program.block(block_name)


def plan(program: Program, block_name: str, model: str | None = None) -> tuple[str, tuple[Site, ...]]:
    """The module Admin's profile runs (``model``, default: the model that stacks the block, else the block
    itself) and its sites in execution order, for ``program``, the recipe's output."""
    target = _target(program, block_name, model)
    sites = _sites(program, target, program.block(block_name))
    if not sites:
        raise RecipeError(f"'{target.name}' does not apply '{block_name}'")
    return target.name, sites


@recipe_pass("admin")
def apply(program: Program, block_name: str, *, model: str | None = None) -> RecipeResult:
    """Admin's graph on ``block_name``, every omega at 1; the profile that sets them is
    :func:`blockir.lifecycle.admin.apply`'s ``init``, run on a module compiled from ``model``."""
    block = target_block(program, block_name)
    new, changes = _rewrite(program, block)
    _, sites = plan(new, block_name, model)
    notes = ["omega_i = sqrt(Var(x_0) + sum_{j<i} Var(F_j)) from one eval-mode pass with every omega = 1 "
             "(init(module) runs it; init.profile holds the result)",
             f"the paper profiles on no more than {PROFILE_TOKENS} tokens; the batch, mode and dtype are "
             "initialisation inputs",
             "the topology verifier warns (W0402) about the learned shortcut vectors: that is Admin's contract"]
    notes += [f"{s.omega} does not fold: {s.reason}" for s in sites if s.reason is not None]
    folds = sum(s.reason is None for s in sites)
    notes.append(f"{folds} of {len(sites)} omegas fold into weights after training (init.fold(module))")
    return RecipeResult(new, None, Report("Admin", block_name, (("omega init before profiling", 1.0),),
                                          tuple(changes), tuple(notes)))
