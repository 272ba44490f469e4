"""Transform: inline a stack's layers into the block that calls it.

A boundary that crosses layers — the last residual add of layer i and the
first norm of layer i+1, or of the stack's final norm — is invisible while
each layer is its own block. Inlining makes it one SSA list the fusion pass
can see. Declarations and values of layer i are renamed ``name.i.<name>``,
so parameter keys and traced value names stay exactly what they were; the
layer index, layer count and the layer's constants are substituted into its
constant expressions.

A stack is inlined only when nothing in its layer draws dropout (p > 0):
each layer module draws its own dropout seed, and one inlined graph could
not reproduce those masks.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable, Mapping

from blockir.ir import consts as C
from blockir.ir import ops as O
from blockir.ir.decls import Decl, InstanceDecl, KindDecl
from blockir.ir.program import Block, Program

VALUE_FIELDS = ("result", "operand", "lhs", "rhs", "value", "branch", "shortcut", "normalized", "residual", "site")
DECL_FIELDS = ("decl", "param", "branch_param")
EXPR_FIELDS = ("p", "factor", "branch_factor", "shortcut_factor")
_EXPRS = (C.Num, C.Name, C.Bin, C.Neg)


def substitute(expr: C.ConstExpr, env: dict[str, C.ConstExpr]) -> C.ConstExpr:
    if isinstance(expr, C.Name):
        return env.get(expr.name, expr)
    if isinstance(expr, C.Bin):
        return replace(expr, left=substitute(expr.left, env), right=substitute(expr.right, env))
    if isinstance(expr, C.Neg):
        return replace(expr, operand=substitute(expr.operand, env))
    return expr


def _rename_op(op: O.Op, value: Callable[[str], str], decl: Callable[[str], str],
               env: dict[str, C.ConstExpr]) -> O.Op:
    changes: dict[str, Any] = {}
    for f in fields(op):
        v = getattr(op, f.name)
        if v is None:
            continue
        if f.name in VALUE_FIELDS:
            changes[f.name] = value(v)
        elif f.name == "args":
            changes[f.name] = tuple(value(a) for a in v)
        elif f.name in DECL_FIELDS:
            changes[f.name] = decl(v)
        elif f.name in EXPR_FIELDS:
            changes[f.name] = substitute(v, env)
    return replace(op, **changes)


def _rename_decl(d: Decl, prefix: str, env: dict[str, C.ConstExpr]) -> Decl:
    name = prefix + d.name
    if isinstance(d, KindDecl):
        args = tuple((k, substitute(v, env) if isinstance(v, _EXPRS) else v) for k, v in d.args)
        return replace(d, name=name, args=args)
    if isinstance(d, InstanceDecl):
        return replace(d, name=name, count=substitute(d.count, env) if d.count is not None else None)
    return replace(d, name=name)


def _layer_env(layer: Block, index: int, count: C.ConstExpr) -> dict[str, C.ConstExpr]:
    env: dict[str, C.ConstExpr] = {C.LAYER: C.Num(index), C.NUM_LAYERS: count}
    for c in layer.consts:
        env[c.name] = substitute(c.value, env)
    return env


def _draws_dropout(block: Block) -> bool:
    return any(isinstance(op, O.DropoutOp) and not (isinstance(op.p, C.Num) and op.p.value == 0) for op in block.ops)


def _inline_call(program: Program, call: O.CallOp, stack: InstanceDecl, n: int) -> tuple[list[Decl], list[O.Op], str]:
    layer = program.block(stack.block)
    decls: list[Decl] = []
    ops: list[O.Op] = []
    current = list(call.args)
    for i in range(n):
        prefix = f"{stack.name}.{i}."
        env = _layer_env(layer, i, stack.count)  # type: ignore[arg-type]
        inputs = {op.result: arg for op, arg in zip(layer.inputs, current)}
        decls += [_rename_decl(d, prefix, env) for d in layer.decls]

        def value(v: str, inputs: dict[str, str] = inputs, prefix: str = prefix) -> str:
            return inputs.get(v, prefix + v)

        def decl(d: str, prefix: str = prefix) -> str:
            return prefix + d

        out = None
        for op in layer.ops:
            if isinstance(op, O.InputOp):
                continue
            if isinstance(op, O.OutputOp):
                out = value(op.value)
                continue
            ops.append(_rename_op(op, value, decl, env))
        current = [out] + current[1:]  # the state threads through; other inputs (memory) are shared
    return decls, ops, current[0]


def _count(program: Program, stack: InstanceDecl) -> int | None:
    """The stack's depth from the file's sizes (None when it depends on a size given only at compile time)."""
    env = {d.name: d.size for d in program.dims if d.size is not None} | {c.name: c.value for c in program.consts}
    try:
        return int(C.evaluate(substitute(stack.count, env), {C.LAYER: 0, C.NUM_LAYERS: 1}))  # type: ignore[arg-type]
    except C.ConstError:
        return None


def inline_stacks(program: Program, name: str, layers: Mapping[str, int] | None = None) -> Program:
    """Inline every dropout-free stack that block ``name`` calls exactly once.

    ``layers`` limits how many layers of the named stacks are written out (analyses that extrapolate
    a repeating pattern need only the first few); ``num_layers`` keeps the declared count.
    """
    layers = layers or {}
    parent = program.block(name)
    calls: dict[str, list[O.CallOp]] = {}
    for op in parent.ops:
        if isinstance(op, O.CallOp):
            calls.setdefault(op.decl, []).append(op)
    inlined: dict[str, tuple[list[Decl], list[O.Op], str]] = {}
    for d in parent.decls:
        if isinstance(d, InstanceDecl) and d.count is not None and len(calls.get(d.name, ())) == 1 \
                and not _draws_dropout(program.block(d.block)) and (n := _count(program, d)) is not None:
            inlined[d.name] = _inline_call(program, calls[d.name][0], d, min(n, layers.get(d.name, n)))
    if not inlined:
        return program
    decls = [x for d in parent.decls for x in (inlined[d.name][0] if d.name in inlined else [d])]
    ops: list[O.Op] = []
    renamed: dict[str, str] = {}
    for op in parent.ops:
        op = _rename_op(op, lambda v: renamed.get(v, v), lambda d: d, {})
        if isinstance(op, O.CallOp) and op.decl in inlined:
            _, layer_ops, out = inlined[op.decl]
            ops += layer_ops
            renamed[op.result] = out
        else:
            ops.append(op)
    block = replace(parent, decls=tuple(decls), ops=tuple(ops))
    return replace(program, blocks=tuple(block if b.name == name else b for b in program.blocks))
