"""Initialisation recipes a block states it follows, checked against the graph they need.

A depth exponent or a pair of scales copied from a paper is not the method:
``const fixup = 1`` needs no norm, a learned scalar multiplier and scalar
biases on every branch (Zhang et al., arXiv:1901.09321); ``const deepscalelm
= 1`` needs every update to be ``lambda * x + beta * F(x)`` with constant
scales and ``lambda^2 + beta^2 = 1`` (Kedia et al., arXiv:2403.09635);
``const tfixup = 1`` needs no norm and T-Fixup's gain for its side and depth on
every built-in branch (Huang et al., 2020).
"""
from __future__ import annotations

from blockir.analyses.facts import stated
from blockir.analyses.key_roles import token_table
from blockir.analyses.sizes import block_env, layer_counts, program_env, value
from blockir.analyses.structure import Branch, Sublayer, wrapper
from blockir.analyses.summaries import summaries
from blockir.analyses.tfixup import gains
from blockir.diagnostics import Diagnostic, Note, error
from blockir.ir.consts import Name
from blockir.ir.decls import InstanceDecl, KindDecl
from blockir.ir.traits import Learned, Normalizes, Scales
from blockir.ir.program import Block, Program
from blockir.verifiers.registry import verifier

FIXUP_HINT = ("Fixup removes every norm, zero-initialises each branch's last layer, rescales the others by "
              "L^(-1/(2m-2)), and adds a scalar multiplier and scalar biases to every branch; "
              "`blockir recipe fixup` writes the graph and the branches' init_zero, init_scale and fixup_bias")
TFIXUP_HINT = ("T-Fixup removes every norm and Xavier-initialises each branch with gain 0.67 N^(-1/4) (encoder) or "
               "(9N)^(-1/4) (decoder: it reads encoder memory) on v/o and the MLP, for N layers, draws the input "
               "embeddings from N(0, d^(-1/2)) scaled by (9N)^(-1/4), and trains without warmup; "
               "`blockir recipe tfixup` writes it")
DSLM_HINT = "DeepScaleLM keeps unit variance with lambda^2 + beta^2 = 1 (beta^2 = 2/N, lambda^2 = 1 - 2/N for N layers)"


def _learned(block: Block, name: str | None, kind: str) -> bool:
    decl = block.decl_map.get(name or "")
    return isinstance(decl, KindDecl) and decl.kind == kind and (kind != "bias" or decl.arg("axis") is None)


def _fixup_missing(block: Block, s: Sublayer, b: Branch) -> list[str]:
    norms = [n.decl for n in (*b.pre_norms, b.out_norm, s.post_norm) if n is not None and n.has(Normalizes)]
    out = [f"keeps norm '{n}'" for n in dict.fromkeys(norms)]
    if not any(op.has(Scales) and _learned(block, op.param, "scalar") for op in b.ops):
        out.append("has no scalar multiplier (scalar(init=1))")
    if sum(op.has(Learned) and _learned(block, op.param, "bias") for op in b.ops) < 2:
        out.append("has no scalar biases before its first weight layer and after its multiplier (bias(init=0))")
    decl = block.decl_map.get(getattr(b.call, "decl", "") or "")
    if isinstance(decl, KindDecl) and decl.spec.arg("fixup_bias") is not None and not decl.arg("fixup_bias"):
        out.append(f"has no scalar biases inside '{decl.name}' (fixup_bias=true)")
    return out


def _fixup(block: Block, stated_at: Note) -> list[Diagnostic]:
    out, seen = [], set()
    for s in wrapper(block).sublayers:
        for b in s.branches:
            missing = _fixup_missing(block, s, b)
            seen.update(n.result for n in (*b.pre_norms, b.out_norm, s.post_norm) if n is not None)
            if missing:
                out.append(error("E0442", f"'{block.name}' states fixup = 1 but branch '{b.name}' "
                                 + " and ".join(missing), s.root.span, notes=[stated_at], hint=FIXUP_HINT))
    out += [error("E0442", f"'{block.name}' states fixup = 1 but keeps norm '{op.decl}'", op.span, notes=[stated_at],
                  hint=FIXUP_HINT) for op in block.ops if op.has(Normalizes) and op.result not in seen]
    return out


def _deepscalelm(block: Block, env: dict, stated_at: Note) -> list[Diagnostic]:
    out = []
    for s in wrapper(block).sublayers:
        skip = [op.factor for op in s.shortcut_ops if op.has(Scales) and op.factor is not None]
        scale = [op.factor for b in s.branches for op in b.scales if op.factor is not None]
        # a fused add+norm carries both scales itself
        skip += [f for f in (s.root.shortcut_scale(),) if f is not None]
        scale += [f for f in (s.root.branch_scale(),) if f is not None]
        lam = value(skip[0], env) if len(skip) == 1 else None
        beta = value(scale[0], env) if len(scale) == 1 and len(s.branches) == 1 else None
        if lam is None or beta is None:
            out.append(error("E0441", f"'{block.name}' states deepscalelm = 1 but this update is not "
                             "lambda * x + beta * F(x) with constant scales on the shortcut and on its one branch",
                             s.root.span, notes=[stated_at], hint=DSLM_HINT))
        elif abs(lam * lam + beta * beta - 1) > 1e-6:
            out.append(error("E0441", f"DeepScaleLM scales lambda = {lam:.6g} and beta = {beta:.6g} give "
                             f"lambda^2 + beta^2 = {lam * lam + beta * beta:.6g}, not 1: the update does not keep "
                             "unit variance", s.root.span, notes=[stated_at], hint=DSLM_HINT))
    return out


def _nested(program: Program, block: Block) -> list[Block]:
    """The blocks ``block`` runs through single instances, itself first: they are built in its layers."""
    out: list[Block] = []
    todo = [block.name]
    while todo:
        name = todo.pop(0)
        if name in {b.name for b in out} or name not in program.block_map:
            continue
        out.append(program.block(name))
        todo += [d.block for d in program.block(name).decls if isinstance(d, InstanceDecl) and d.count is None]
    return out


def _tfixup(program: Program, block: Block, base: dict, depths: tuple[int, ...], stated_at: Note) -> list[Diagnostic]:
    """T-Fixup on the stating block and on every block it instantiates once (a nested sublayer is built with
    num_layers = 1, so its gains are compared with the stating block's depth, as they are built)."""
    out: list[Diagnostic] = []
    decoder = summaries(program)[block.name].has_cross
    # a block without cross-attention is the paper's encoder; the recipe may give it the decoder scale
    sides = ("decoder",) if decoder else ("encoder", "decoder")
    for inner in _nested(program, block):
        where = "" if inner is block else f", which runs '{inner.name}',"
        out += [error("E0445", f"'{block.name}' states tfixup = 1{where} but keeps norm '{op.decl}'", op.span,
                      notes=[stated_at], hint=TFIXUP_HINT)
                for op in inner.ops if op.has(Normalizes)]
        branches = [d for d in inner.decls if isinstance(d, KindDecl) and d.spec.arg("init_gain") is not None]
        for d in branches:
            if d.arg("init_gain") is None:
                out.append(error("E0445", f"'{block.name}' states tfixup = 1{where} but '{d.name}' has no init_gain: "
                                 "T-Fixup scales its value/output or MLP matrices", d.span, notes=[stated_at],
                                 hint=TFIXUP_HINT))
                continue
            for n in depths:
                got = value(d.arg("init_gain"), block_env(base, inner, 0, n if inner is block else 1))
                want = [gains(n)[side] for side in sides]
                if got is not None and not any(abs(got - w) <= 1e-9 * w for w in want):
                    scale = " or ".join(f"{gains(n)[side]:.6g} ({side})" for side in sides)
                    out.append(error("E0445", f"init_gain of '{d.name}' is {got:.6g} in a {n}-layer stack, but "
                                     f"T-Fixup's scale is {scale}", d.span, notes=[stated_at], hint=TFIXUP_HINT))
                    break
    return out + _tfixup_embeddings(program, block, base, stated_at)


def _tfixup_embeddings(program: Program, block: Block, base: dict, stated_at: Note) -> list[Diagnostic]:
    """The token embedding of a model stacking a T-Fixup block: N(0, d^(-1/2)), then (9N)^(-1/4)."""
    out: list[Diagnostic] = []
    for model in program.blocks:
        for stack in (d for d in model.decls if isinstance(d, InstanceDecl) and d.block == block.name):
            table = model.decl_map.get(token_table(model) or "")
            if not isinstance(table, KindDecl) or stack.count is None:
                continue
            env = block_env(base, model)
            n, width = value(stack.count, env), value(Name(table.arg("width")), env)
            if n is None or width is None:
                continue
            want = {"init_std": width ** -0.5, "init_gain": (9 * n) ** -0.25}
            got = {arg: value(table.arg(arg), env) if table.arg(arg) is not None else None for arg in want}
            wrong = [f"{arg} is {'unset' if got[arg] is None else f'{got[arg]:.6g}'}, not {w:.6g}"
                     for arg, w in want.items() if got[arg] is None or abs(got[arg] - w) > 1e-9 * w]
            if wrong:
                out.append(error("E0445", f"'{model.name}' stacks '{block.name}', which states tfixup = 1, but its "
                                 f"token embedding '{table.name}' is not T-Fixup's N(0, d^(-1/2)) scaled by "
                                 f"(9N)^(-1/4) for N = {n:g}: " + "; ".join(wrong), table.span, notes=[stated_at],
                                 hint=TFIXUP_HINT))
    return out


@verifier("recipe_contracts")
def verify_recipe_contracts(program: Program) -> list[Diagnostic]:
    base = program_env(program)
    counts = layer_counts(program, base)
    out: list[Diagnostic] = []
    for block in program.blocks:
        env = block_env(base, block)
        facts = stated(block, env)
        if "fixup" in facts and facts["fixup"].value == 1:
            out += _fixup(block, Note("stated here", facts["fixup"].const.span))
        if "deepscalelm" in facts and facts["deepscalelm"].value == 1:
            out += _deepscalelm(block, env, Note("stated here", facts["deepscalelm"].const.span))
        if "tfixup" in facts and facts["tfixup"].value == 1:
            out += _tfixup(program, block, base, counts.get(block.name, (1,)),
                           Note("stated here", facts["tfixup"].const.span))
    return out
