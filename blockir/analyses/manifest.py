"""The block manifest: the architecture fields tensor shapes cannot tell.

For a block: topology, state layout, branch order, every norm site (family,
placement, reduction axes, epsilon, centering, scale, bias, accumulation
dtype), residual and branch scales, branch dropout and dtypes. For a model:
its layers and the final norm. Values are evaluated for layer 0 of the first
stack that instantiates the block.

A file that states a mesh also gets ``parallel_layout``, runtime ownership kept
apart from the architecture: the mesh axes and, per block, the placement of
its inputs and result at the block boundary, the stream layout these imply and
each parameter's placement in the derived tensor-parallel plan.
"""
from __future__ import annotations

from typing import Any

import yaml

from blockir.analyses.keys import key_table
from blockir.analyses.layouts import BlockLayouts, describe_layout, layouts, meshes, placement
from blockir.norms import family
from blockir.analyses.parallel import derive_plan
from blockir.analyses.sizes import Env, Sizes, block_env, layer_counts, program_env, value
from blockir.analyses.dropout_owners import dropout_owners
from blockir.analyses.facts import stated
from blockir.analyses.manifest_training import embedding_norm, initialisation, padding_policy
from blockir.analyses.recipe_contract import recipe_contract
from blockir.analyses.shortcut_weights import stack_weights
from blockir.analyses.structure import Branch, Sublayer, normalized_shortcut, wrapper
from blockir.diagnostics import BlockError
from blockir.ir import consts as C
from blockir.ir.decls import KindDecl
from blockir.analyses.block_queries import applies_norm, has, norm_decl
from blockir.ir.traits import Normalizes, Scales, Stochastic
from blockir.ops import Op
from blockir.ir.program import Block, Program
from blockir.ir.types import Layout, Role
from blockir.analyses.classify import RECIPES, REGISTRY, Classification, classify, final_norm

PLACEMENT = {"pre": "pre_branch", "out": "branch_output", "post": "post_add", "final": "final",
             "embedding": "embedding"}
EQUATIONS = {t.name: t.equation for t in REGISTRY} | RECIPES


def _number(v: float | int | None) -> float | int | None:
    return float(v) if isinstance(v, float) else v


def norm_site(block: Block, op: Op, placement: str, env: Env) -> dict[str, Any]:
    decl = norm_decl(block, op)
    assert decl is not None
    kind = decl.kind
    fam = family(decl)
    site: dict[str, Any] = {
        "name": decl.name, "family": kind, "placement": PLACEMENT.get(placement, "other"),
        "reduction_axes": [] if fam.elementwise else list(decl.arg("axes")),
        "epsilon": _number(value(decl.arg("eps"), env)) if decl.arg("eps") is not None else None,
        "center": fam.centers(decl),
        "scale": fam.scale(decl), "bias": fam.bias(decl),
        "accum": decl.arg("accum"), "tied": bool(decl.arg("tied")),
    }
    if fam.batch_coupled:
        # one moment per channel, taken over every other axis of the input: the rows of the batch
        operand = op.operand if applies_norm(op) else op.residual
        site["reduction_axes"] = [a for a in block.type_of(operand).names if a not in decl.arg("axes")]
    return site | fam.manifest(decl, lambda e: value(e, env))


def _collapse(sites: list[dict[str, Any]]) -> dict[str, Any]:
    """One field per manifest key: the common value, or the distinct values in order."""
    out: dict[str, Any] = {}
    for key in ("family", "placement", "reduction_axes", "epsilon", "center", "scale", "bias"):
        values: list[Any] = []
        for s in sites:
            if s[key] not in values:
                values.append(s[key])
        out[key] = values[0] if len(values) == 1 else values
    return out


def _scale(block: Block, op: Op, env: Env) -> Any:
    if op.factor is not None:
        return _number(value(op.factor, env))
    decl = block.decl_map.get(op.param or "")
    init = _number(value(decl.arg("init"), env)) if isinstance(decl, KindDecl) else None
    return {"learned": decl.kind if isinstance(decl, KindDecl) else "scale", "name": op.param, "init": init}


def _product(block: Block, ops: tuple, env: Env) -> Any:
    scales = [_scale(block, op, env) for op in ops if has(op, Scales)]
    if not scales:
        return 1.0
    return scales[0] if len(scales) == 1 else scales


def _dropout(op: Op, env: Env) -> dict[str, Any]:
    return {"p": _number(value(op.p, env)), "mask": op.mask}


def _branch_fields(block: Block, b: Branch, env: Env) -> dict[str, Any]:
    drops = [_dropout(d, env) for d in b.dropouts]
    return {"name": b.name, "kind": b.label, "scale": _product(block, b.modifiers, env),
            "dropout": drops[0] if len(drops) == 1 else drops or 0.0,
            **({"reads": list(b.memory)} if b.memory else {})}


def block_manifest(program: Program, block: Block, env: Env,
                   cache: dict[str, Classification] | None = None, recipe: str | None = None) -> dict[str, Any]:
    """The manifest of one block; ``recipe`` names the recipe its contract follows (default: by topology)."""
    c = classify(program, block, cache)
    w = wrapper(block)
    t = block.result
    out: dict[str, Any] = {"kind": block.kind, "topology": c.topology, "equation": EQUATIONS.get(c.topology, "")}
    out["state_layout"] = [a.role.value for a in t.axes]
    out["state"] = {"axes": list(t.names), "dtype": t.dtype.value if t.dtype else None}
    if block.more_results:  # result i + 1 feeds input i + 1 of the next layer of a stack
        out["carried_streams"] = [{"input": p.name, "axes": list(r.names), "kind": "scores" if r.is_scores else "state"}
                                  for p, r in zip(block.params[1:], block.more_results)]
    facts = {name: f.value for name, f in stated(block, env).items()}
    if c.form == "stack":
        out["layers"] = [{"name": m.decl, "block": m.block, "count": m.count, "topology": m.topology}
                         for m in c.members]
        fn = final_norm(block)
        out["final_norm"] = norm_site(block, fn, "final", env) if fn is not None else None
        en = embedding_norm(block)
        if en is not None:  # Peri-LN's optional input norm, BERT's embedding LayerNorm: a stack-boundary choice
            out["embedding_norm"] = norm_site(block, en, "embedding", env)
        out["shortcut_weights"] = [s.data() for s in stack_weights(program, block, env)]
    else:
        out |= _update_fields(block, w.sublayers, c, env)
        contract = recipe_contract(block, c.topology, out["equation"], out["branch_order"],
                                   env.get(C.NUM_LAYERS), env, recipe)
        if contract is not None:
            out["recipe_contract"] = contract
    init = initialisation(block, env)
    if init:
        out["initialisation"] = init
    out["checkpoint"] = checkpoint_keys(program, block)
    out["dropout_owners"] = [o.data() for o in dropout_owners(block, env)]
    out["padding"] = padding_policy(program, block)
    out["dtypes"] = {"inputs": {p.name: p.type.dtype.value if p.type.dtype else None for p in block.params},
                     "output": t.dtype.value if t.dtype else None}
    if facts:
        out["stated"] = facts
    return out


def _update_fields(block: Block, subs: tuple[Sublayer, ...], c: Classification, env: Env) -> dict[str, Any]:
    places = wrapper(block).norm_sites
    norms = [norm_site(block, op, places.get(op.result, "other"), env) for op in block.ops
             if has(op, Normalizes)]
    unique: dict[str, dict[str, Any]] = {}
    for n in norms:
        unique.setdefault(n["name"], n)  # a tied norm counts once in the summary
    fields: dict[str, Any] = {"residual_form": c.form, "branch_order": list(c.branch_order)}
    fields["norm"] = _collapse(list(unique.values())) if unique else None
    fields["norm_sites"] = norms
    fields["residual"] = {"shortcut_scale": [_product(block, s.shortcut_ops, env) for s in subs],
                          "updates": [[_branch_fields(block, b, env) for b in s.branches] for s in subs]}
    from_norm = [normalized_shortcut(block, s) for s in subs]
    if any(n is not None for n in from_norm):  # the stream continues from these norms' outputs, on purpose
        fields["residual"]["from_norm"] = [n.decl if n is not None else None for n in from_norm]
    branch_drops = {id(d) for s in subs for b in s.branches for d in b.dropouts}
    inner = [{"value": op.result, **_dropout(op, env)} for op in block.ops
             if has(op, Stochastic) and id(op) not in branch_drops]
    if inner:
        fields["inner_dropout"] = inner
    return fields


def checkpoint_keys(program: Program, block: Block) -> list[dict[str, Any]] | str:
    """The keys the block's own declarations own (a stack's layers list theirs under their block), each with
    its role, layout, fused row order and alias; a sentence when a size the keys need is open."""
    try:
        table = key_table(program, block, Sizes.of(program), nested=False)
    except BlockError as exc:
        return f"keys need every size: {exc.diagnostics[0].message}"
    return [{"key": k.name, "shape": list(k.shape), "role": k.role, "layout": k.layout,
             **({"fused": k.fused} if k.fused else {}), **({"alias_of": k.alias_of} if k.alias_of else {})}
            for k in table.keys]


STREAM_ROLES = {Role.SEQ: "sequence", Role.MODEL: "hidden"}


def _stream_layout(program: Program, layout: Layout, mesh: str) -> str | None:
    """The plan's name for a stream placed ``layout`` over ``mesh``; None when no plan applies (partial, batch)."""
    p = placement(layout, mesh)
    if p.kind == "replicate":
        return "replicated"
    return STREAM_ROLES.get(program.dim_map[p.axis].role) if p.kind == "shard" and p.axis else None


def _boundaries(ctx: BlockLayouts) -> dict[str, Any]:
    block = ctx.block
    returned = block.output.value if block.output is not None else None
    result = block.result_layout or (ctx.of(returned) if returned else ())
    return {"inputs": {p.name: describe_layout(layout) for p, layout in zip(block.params, ctx.inputs)},
            "output": describe_layout(result)}


def parallel_layout(program: Program, blocks: list[Block], base: Env) -> dict[str, Any]:
    """Runtime ownership of ``blocks``: empty for a file without a mesh axis."""
    axes = meshes(program)
    if not axes:
        return {}
    out: dict[str, Any] = {"mesh": list(axes), "blocks": {}}
    for b in blocks:
        ctx = layouts(program, b)
        entry = _boundaries(ctx)
        stream = _stream_layout(program, ctx.inputs[0], axes[0]) if len(axes) == 1 and b.params else None
        if stream is not None:
            world = base.get(axes[0])
            try:
                plan = derive_plan(program, b, Sizes.of(program), stream, int(world) if world else 1)
            except BlockError as exc:  # the manifest describes the file; a plan that does not apply is a fact of it
                first = exc.diagnostics[0]
                entry |= {"stream": stream, "plan_refused": f"{first.code}: {first.message}"}
            else:
                entry |= {"stream": stream, "params": dict(plan.params)}
        out["blocks"][b.name] = entry
    return out


def contract_of(program: Program, name: str, recipe: str) -> dict[str, Any] | None:
    """The recipe contract of block ``name`` of ``program`` (a recipe's result) under ``recipe``."""
    base = program_env(program)
    block = program.block(name)
    env = block_env(base, block, 0, layer_counts(program, base).get(name, (1,))[0])
    return block_manifest(program, block, env, recipe=recipe).get("recipe_contract")


def program_manifest(program: Program, blocks: list[Block] | None = None) -> dict[str, Any]:
    """The manifest of every block (or of ``blocks``), keyed by block name, and their ``parallel_layout``
    when the file states a mesh."""
    base = program_env(program)
    counts = layer_counts(program, base)
    cache: dict[str, Classification] = {}
    chosen = program.blocks if blocks is None else blocks
    out: dict[str, Any] = {
        "file": program.filename,
        "blocks": {b.name: block_manifest(program, b, block_env(base, b, 0, counts.get(b.name, (1,))[0]), cache)
                   for b in chosen}}
    ownership = parallel_layout(program, chosen, base)
    if ownership:
        out["parallel_layout"] = ownership
    return out


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # repeated values are written out, never as anchors


class _ReportDumper(_Dumper):
    """Mappings always in block style, one field a line: reports hold hashes and sentences."""


_ReportDumper.add_representer(dict, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(),
                                                                         flow_style=False))


def to_yaml(data: dict[str, Any], report: bool = False) -> str:
    """YAML with short scalar lists inline ([B, S, D]) and no anchors; a ``report`` keeps every mapping in
    block style and does not fold long lines."""
    if report:
        return yaml.dump(data, Dumper=_ReportDumper, sort_keys=False, default_flow_style=None, allow_unicode=True,
                         width=1 << 16)
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=None, allow_unicode=True)
