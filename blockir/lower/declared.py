"""What a compiled block records of its source that its graph cannot show, for ``blockir.lift`` to read back.

A traced module shows what it computes, not how its author named the axes of its inputs, nor the
arguments that only decided how its branches were initialised (``init_gain``, ``init_std``,
``init_scale``, ``init_zero``), nor the facts the block states about itself (``const deepscalelm = 1``).
The compiled root of a block keeps them: ``blockir_axes``, the axis names of each input, and
``blockir_results``, of each result, with ``blockir_span``, where the block is declared;
``blockir_init``, each declaration's kind and init-only arguments as ``.block`` text with the file's
constants folded in (a per-layer name such as ``num_layers`` stays a name); ``blockir_facts``, each
stated fact as ``name = value``; ``blockir_depth``, the constants outside init-only arguments whose value
depends on the layer or the stack's depth (DeepNorm's ``alpha``), with the number each has in this
layer, which is all a trace shows of it; ``blockir_dropped``, the dropouts of probability 0, which
compile to nothing, each on the one result of a branch call: by the branch's name, the dropout's value
name (which keys its mask) and its right-hand side with ``{0}`` for the call's result.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from blockir.analyses.equivalence import fold
from blockir.analyses.facts import FACTS
from blockir.ir import consts as C
from blockir.ir.decls import KindDecl
from blockir.ir.kinds import INIT_ONLY
from blockir.ir.traits import Calls, Stochastic
from blockir.ir.program import Block, Program

AXES_ATTR = "blockir_axes"
RESULTS_ATTR = "blockir_results"
SPAN_ATTR = "blockir_span"
INIT_ATTR = "blockir_init"
FACTS_ATTR = "blockir_facts"
DROPPED_ATTR = "blockir_dropped"
DEPTH_ATTR = "blockir_depth"


def _text(value: Any, defs: dict[str, C.ConstExpr]) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, C.EXPRS):
        return C.format_expr(fold(value, defs))
    return str(value)


def declared(program: Program, block: Block, value: Callable[[C.ConstExpr], float | int | None]) -> dict[str, Any]:
    """The attributes the compiled root of ``block`` records (no init record when nothing sets one); ``value``
    evaluates a constant expression in this layer (None: it reads a size not given)."""
    out: dict[str, Any] = {AXES_ATTR: tuple(tuple(a.name for a in p.type.axes) for p in block.params),
                           RESULTS_ATTR: tuple(tuple(a.name for a in t.axes) for t in block.results),
                           SPAN_ATTR: block.span}
    # written back into a lifted program that has none of the file's constants and only its own dims: folded
    defs = {**{a.name: a.size for a in program.dims if a.size is not None},
            **{c.name: c.value for c in (*program.consts, *block.consts)}}
    facts = tuple(f"{c.name} = {_text(c.value, defs)}" for c in block.consts if c.name in FACTS)
    if facts:
        out[FACTS_ATTR] = facts
    given = [(d, [(k, d.arg(k)) for k in INIT_ONLY if d.arg(k) is not None]) for d in block.decls
             if isinstance(d, KindDecl)]
    init_names = {n for _, args in given for _, v in args if isinstance(v, C.EXPRS) for n in C.names_in(v)}
    depth = tuple((c.name, _text(c.value, defs), c.span, value(C.Name(c.name))) for c in block.consts
                  if c.name not in FACTS and
                  c.name not in init_names and C.names_in(fold(c.value, defs)) & set(C.LAYER_NAMES))
    if depth:
        out[DEPTH_ATTR] = depth
    dropped = {}
    for op in block.ops:
        if not op.has(Stochastic) or value(op.p) != 0:  # type: ignore[attr-defined]
            continue
        producer = block.producers.get(op.operand)  # type: ignore[attr-defined]
        if producer is not None and producer.has(Calls) and len(block.users.get(op.operand, ())) == 1:
            zero = dataclasses.replace(op, p=C.Num(0.0)).text()  # type: ignore[type-var]
            rhs = zero.split(" = ", 1)[1].replace(op.operand, "{0}", 1)  # type: ignore[attr-defined]
            dropped[producer.decl] = (op.result, rhs)  # type: ignore[attr-defined]
    if dropped:
        out[DROPPED_ATTR] = dropped
    if any(args for _, args in given):
        out[INIT_ATTR] = {d.name: (d.kind, ", ".join(f"{k}={_text(v, defs)}" for k, v in args))
                          for d, args in given if args}
    return out
