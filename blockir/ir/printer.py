"""Deterministic printer. Its output is valid .block text: parse(print(p)) == p.

Every nested expression is printed as its own SSA line (temporaries are
``%N``), every declaration with all of its arguments, and each value's
inferred type as a trailing comment.
"""
from __future__ import annotations

from typing import Any

from blockir.ir.consts import ConstExpr, Num, format_expr, names_in
from blockir.ir.decls import Decl, ExternDecl, InstanceDecl, Param
from blockir.ir.program import Block, Const, Program
from blockir.ir.traits import BlockInput
from blockir.ir.types import Axis, TensorType, format_layout
from blockir.ir.op import OpBase as Op

TYPE_COLUMN = 48
INDENT = "  "


def format_type(t: TensorType) -> str:
    return str(t)


def _value(kind: str, v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if kind == "axes":
        return v[0] if len(v) == 1 else "[" + ", ".join(v) + "]"
    if kind == "numbers":
        return "[" + ", ".join(repr(x) for x in v) + "]"
    if isinstance(v, (Num,)) or hasattr(v, "op") or hasattr(v, "operand") or hasattr(v, "name") and not isinstance(v, str):
        return format_expr(v)
    return str(v)


def format_decl(d: Decl) -> str:
    if isinstance(d, ExternDecl):
        params = ", ".join(_param(p) for p in d.params)
        if d.contract is not None:
            terms = [f"norm={format_decl(d.contract.norm).split(': ', 1)[1]}"]
            if d.contract.residual is not None:
                terms.append(f"residual={d.contract.residual}")
            params += "; " + ", ".join(terms)
        result = format_layout(d.result, d.result_layout)
        if d.more:
            result = "(" + ", ".join([result, *(format_layout(t, ()) for t in d.more)]) + ")"
        return f"{d.name}: extern({params}) -> {result}"
    if isinstance(d, InstanceDecl):
        return f"{d.name}: {d.block}" + (f" * {format_expr(d.count, 3)}" if d.count is not None else "")
    parts = []
    for spec in d.spec.args:
        value = d.arg(spec.name)
        if value is None:
            continue
        text = _value(spec.kind, value)
        parts.append(text if spec.positional else f"{spec.name}={text}")
    return f"{d.name}: {d.kind}({', '.join(parts)})"


def _factor(c: ConstExpr) -> str:
    return format_expr(c, 2)


def format_op(op: Op) -> str:
    return op.text()


def _with_type(line: str, t: TensorType | None, more: tuple[TensorType, ...] = ()) -> str:
    if t is None:
        return line
    return f"{line.ljust(TYPE_COLUMN - len(INDENT))}  # {', '.join(format_type(u) for u in (t, *more))}"


def _param(p: Param) -> str:
    return f"{p.name}: {format_layout(p.type, p.layout)}"


def format_block(b: Block) -> str:
    result = format_layout(b.result, b.result_layout)
    if b.more_results:
        result = f"({', '.join([result, *map(format_type, b.more_results)])})"
    lines = [f"{b.kind} {b.name}({', '.join(_param(p) for p in b.params)}) -> {result} {{"]
    for c in b.consts:
        lines.append(f"{INDENT}const {c.name} = {format_expr(c.value)}")
    for d in b.decls:
        lines.append(INDENT + format_decl(d))
    if b.consts or b.decls:
        lines.append("")
    for op in b.ops:
        if op.has(BlockInput):
            continue  # the signature declares it
        lines.append(INDENT + _with_type(format_op(op), op.type, getattr(op, "more_types", ())))
    lines.append("}")
    return "\n".join(lines)


def _file_scope_order(p: Program) -> list[Axis | Const]:
    """Merge dims and consts, each kept in its own order, emitting a dim as soon as the names it
    uses are defined. The source order was such a merge, so the greedy choice never gets stuck."""
    defined_later = {d.name for d in p.dims} | {c.name for c in p.consts}
    dims, consts, out = list(p.dims), list(p.consts), []

    def ready(item: Axis | Const) -> bool:
        expr = item.size if isinstance(item, Axis) else item.value
        return expr is None or not (names_in(expr) & defined_later)

    while dims or consts:
        nxt = dims.pop(0) if dims and (ready(dims[0]) or not consts) else consts.pop(0)
        defined_later.discard(nxt.name)
        out.append(nxt)
    return out


def format_program(p: Program) -> str:
    out = []
    for item in _file_scope_order(p):
        if isinstance(item, Axis):
            size = f" = {format_expr(item.size)}" if item.size is not None else ""
            out.append(f"dim {item.name}: {item.role.value}{size}")
        else:
            out.append(f"const {item.name} = {format_expr(item.value)}")
    chunks = ["\n".join(out)] if out else []
    chunks += [format_block(b) for b in p.blocks]
    return "\n\n".join(chunks) + "\n"
