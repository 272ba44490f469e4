"""The contract an extern norm declares after a ``;`` in its signature: ``norm=KIND(…)``, ``residual=K``.

A third-party fused add+norm (Transformer Engine, Apex, Liger) is bound as an extern, so nothing of its
code is visible to the verifiers. The contract states what it computes — the built-in norm named by
``norm`` applied to the sum of its two inputs — and which of its two results is that sum (the value
that continues the residual stream). The norm is built as a
declaration of the extern's name, so its arguments are checked as a norm's are; its ``accum`` is the
statistics dtype the implementation promises.
"""
from __future__ import annotations

from typing import Any

from blockir.frontend import ast
from blockir.ir.decls import NormContract, Param
from blockir.ir.kinds import KINDS
from blockir.ir.types import TensorType
from blockir.norms import family_named

TERMS = ("norm", "residual")
_SHAPE_HINT = ("declare extern(x: [B, S, D], residual: [B, S, D]; norm=…, residual=1) -> ([B, S, D], [B, S, D]): "
               "the results in the order the module returns them, residual=K naming the sum")


def norm_contract(builder: Any, d: ast.DeclAst, scope: Any, params: list[Param],
                  results: list[TensorType]) -> NormContract | None | bool:
    """The declared contract; None when there is none, False when it was reported wrong."""
    if not d.args and not d.kwargs:
        return None
    if d.args:
        builder.err("E0454", "an extern's contract names each term: norm=KIND(…), residual=K", d.args[0].span,
                    hint="write extern(x: …, residual: …; norm=rmsnorm(D), residual=1) -> (…, …)")
        return False
    terms: dict[str, ast.KwArg] = {}
    for kw in d.kwargs:
        if kw.name not in TERMS:
            builder.err("E0104", f"unknown term '{kw.name}' in the contract of extern '{d.name}'", kw.span,
                        hint="accepted: " + ", ".join(TERMS))
            return False
        if kw.name in terms:
            builder.err("E0102", f"term '{kw.name}' is given twice", kw.span)
            return False
        terms[kw.name] = kw
    if "norm" not in terms:
        builder.err("E0105", f"the contract of extern '{d.name}' names no norm", d.kind_span,
                    hint="state the built-in norm it computes: norm=rmsnorm(D, eps=1e-6)")
        return False
    call = terms["norm"].value
    spec = KINDS.get(call.callee) if isinstance(call, ast.Call) else None
    if spec is None or spec.category != "norm":
        builder.err("E0454", f"the norm of extern '{d.name}' must be a built-in norm, as in norm=rmsnorm(D)",
                    call.span, hint="norms: " + ", ".join(k for k, s in KINDS.items() if s.category == "norm"))
        return False
    if family_named(call.callee).batch_coupled:
        builder.err("E0454", f"extern '{d.name}' states {call.callee}, which takes its moments over the rows of a "
                    "batch; a fused add+norm normalizes each row by its own statistics", call.span,
                    hint="state the row norm the kernel computes: rmsnorm(…) or layernorm(…)")
        return False
    norm = builder.kind_decl(ast.DeclAst(d.name, call.callee, call.args, call.kwargs, call.span, call.callee_span),
                             spec, scope)
    if norm is None:
        return False
    residual = _residual(builder, d, terms.get("residual"), len(params), len(results))
    if residual is False:
        return False
    axes = {t.names for t in (*(p.type for p in params), *results)}
    reduced = norm.arg("axes")
    if len(axes) != 1 or reduced is None or tuple(reduced) != next(iter(axes))[-len(tuple(reduced)):]:
        shown = ", ".join(sorted("[" + ", ".join(a) + "]" for a in axes))
        builder.err("E0454", f"extern '{d.name}' states it computes {call.callee} over "
                    f"{', '.join(reduced or ())}, but its signature has the axes {shown}", d.kind_span,
                    hint="every input and result of an extern norm has the axes of the row it normalizes, ending "
                         "with the norm's")
        return False
    return NormContract(norm, residual, terms["norm"].span)


def _residual(builder: Any, d: ast.DeclAst, kw: ast.KwArg | None, inputs: int, results: int) -> int | bool:
    if (inputs, results) != (2, 2):
        builder.err("E0454", f"an extern norm is a fused add+norm: it takes 2 inputs and returns 2 results; "
                    f"'{d.name}' takes {inputs} and returns {results}", d.kind_span, hint=_SHAPE_HINT)
        return False
    value = kw.value if kw is not None else None
    if not isinstance(value, ast.Num) or value.value not in (0, 1):
        builder.err("E0454", f"extern '{d.name}' is a fused add+norm: residual=0 or residual=1 must say which "
                    "result is the sum that continues the stream", kw.span if kw is not None else d.kind_span,
                    hint="Transformer Engine, Apex and Liger return (normalized, residual): residual=1")
        return False
    return int(value.value)
