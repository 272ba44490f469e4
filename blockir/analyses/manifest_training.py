"""Manifest fields the training graph determines: initialisation gains, per-value padding policy and the
norm applied to the embeddings.

Initialisation is what a declaration states and the module factory applies
(blockir/ir/init_roles.py says which layers each argument reaches): DeepNorm's
``init_gain`` (β) on the update-path matrices, ``init_std=fan_in``,
``init_scale`` (Fixup's multiplier) and ``init_zero`` (a zeroed last layer),
and the initial value of every learned scalar, vector and bias.

The padding policy of a value says whether its valid rows can depend on
padded ones (the rows an attention mask marks as padding):

* ``row_local``: every row is computed from its own row only;
* ``attention_masked``: rows read other rows through attention, so valid
  rows ignore padded ones exactly where the attention mask passed at run time
  excludes them;
* ``batch_stats_masked``: a batch-coupled norm's moments skip padded rows
  (``padding=mask``);
* ``unknown``: an extern's bound module decides;
* ``padding_dependent``: batch moments include padded rows (``padding=include``
  or no stated policy), so valid outputs change with the padding.

A value takes the strongest policy among its operands and its own op.
"""
from __future__ import annotations

from typing import Any

from blockir.norms import family
from blockir.analyses.sizes import Env, value
from blockir.analyses.summaries import callee
from blockir.ir import init_roles
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.analyses.block_queries import applies_norm, has, plain_add, transparent
from blockir.ir.traits import Calls, Normalizes
from blockir.ops import Op
from blockir.ir.program import Block, Program

POLICIES = ("row_local", "attention_masked", "batch_stats_masked", "unknown", "padding_dependent")
_RANK = {p: i for i, p in enumerate(POLICIES)}
ATTENTION = ("self_attention", "cross_attention")


def _number(v: float | int | None) -> float | int | None:
    return float(v) if isinstance(v, float) else v


def initialisation(block: Block, env: Env) -> list[dict[str, Any]]:
    """Every declaration of ``block`` whose initial values the file states, with the layers each reaches."""
    out: list[dict[str, Any]] = []
    for d in block.decls:
        if not isinstance(d, KindDecl):
            continue
        if d.category in ("scale", "shift"):
            out.append({"decl": d.name, "kind": d.kind, "init": _number(value(d.arg("init"), env)),
                        **({"offset": d.arg("offset")} if d.arg("offset", 0) else {})})
            continue
        entry: dict[str, Any] = {}
        if d.arg("init_gain") is not None:
            entry["init_gain"] = _number(value(d.arg("init_gain"), env))
            entry["gain_on"] = list(init_roles.GAINED.get(d.kind, ()))
            entry["unit_gain_on"] = list(init_roles.UNGAINED.get(d.kind, ()))
        if d.arg("init_std") is not None:
            entry["init_std"] = d.arg("init_std")
        if d.arg("init_scale") is not None:
            entry["init_scale"] = _number(value(d.arg("init_scale"), env))
            entry["scale_on"] = list(init_roles.EARLIER.get(d.kind, ()))
        if d.arg("init_zero"):
            entry["init_zero"] = True
            entry["zero_on"] = init_roles.LAST.get(d.kind)
        if entry:
            out.append({"decl": d.name, "kind": d.kind, **entry})
    return out


def _own_policy(program: Program, block: Block, op: Op, memo: dict[str, str]) -> str:
    decl = block.decl_map.get(getattr(op, "decl", "") or "")
    if has(op, Normalizes) and isinstance(decl, KindDecl) and family(decl).batch_coupled:
        return "batch_stats_masked" if decl.arg("padding") == "mask" else "padding_dependent"
    if has(op, Calls) and isinstance(decl, KindDecl) and decl.kind in ATTENTION:
        return "attention_masked"
    if has(op, Calls) and isinstance(decl, ExternDecl):
        return "unknown"
    d = callee(program, block, op)
    if d is not None:
        return _result_policy(program, program.block(d.block), memo)
    return "row_local"


def _result_policy(program: Program, block: Block, memo: dict[str, str]) -> str:
    if block.name not in memo:
        memo[block.name] = "row_local"  # a cycle, reported by the builder, contributes nothing
        policies = padding_policy(program, block, memo)
        memo[block.name] = max(policies.values(), key=_RANK.__getitem__, default="row_local")
    return memo[block.name]


def padding_policy(program: Program, block: Block, memo: dict[str, str] | None = None) -> dict[str, str]:
    """Value name -> padding policy, for every value of ``block`` in op order."""
    memo = {} if memo is None else memo
    out: dict[str, str] = {}
    for op in block.ops:
        if not op.results:
            continue
        own = "row_local" if transparent(op) else \
            _own_policy(program, block, op, memo)
        policy = max([own, *(out.get(v, "row_local") for v in op.operands)], key=_RANK.__getitem__)
        for r in op.results:
            out[r] = policy
    return out


def embedding_norm(block: Block) -> Op | None:
    """A norm applied to a token embedding's output (Peri-LN's optional input norm, BERT's embedding norm)."""
    embedded = {op.result for op in block.ops if has(op, Calls)
                and isinstance(block.decl_map.get(op.decl), KindDecl) and block.decl_map[op.decl].kind == "embedding"}
    for op in block.ops:
        if applies_norm(op) and op.operand in embedded:
            return op
        if (plain_add(op) or transparent(op)) and set(op.operands) & embedded:
            embedded |= set(op.results)  # sums of lookups (tokens + positions), casts, dropout and scales
    return None
