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

from dataclasses import replace
from typing import Callable, Mapping

from blockir.analyses.sizes import Sizes
from blockir.ir import consts as C
from blockir.ir.decls import Decl, InstanceDecl, KindDecl
from blockir.ir.program import Block, Const, Program
from blockir.ir.traits import Calls, Sink, Stochastic
from blockir.ops import Op
from blockir.passes.manager import Pass, program_pass

_EXPRS = (C.Num, C.Name, C.Bin, C.Neg)


def substitute(expr: C.ConstExpr, env: dict[str, C.ConstExpr]) -> C.ConstExpr:
    if isinstance(expr, C.Name):
        return env.get(expr.name, expr)
    if isinstance(expr, C.Bin):
        return replace(expr, left=substitute(expr.left, env), right=substitute(expr.right, env))
    if isinstance(expr, C.Neg):
        return replace(expr, operand=substitute(expr.operand, env))
    return expr


def _rename_op(op: Op, value: Callable[[str], str], decl: Callable[[str], str],
               env: dict[str, C.ConstExpr]) -> Op:
    return op.rename(value, decl, lambda e: substitute(e, env))  # type: ignore[return-value]


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
    return any(op.has(Stochastic) and not (isinstance(op.p, C.Num) and op.p.value == 0)  # type: ignore[union-attr]
               for op in block.ops)


def _inline_layer(layer: Block, args: list[str], values: str, decls: str,
                  env: dict[str, C.ConstExpr]) -> tuple[list[Op], list[str]]:
    """The ops of one application of ``layer`` to ``args``, values prefixed ``values``, declarations ``decls``;
    and the values it returns (the hidden state, then each carried stream)."""
    inputs = {op.result: arg for op, arg in zip(layer.inputs, args)}
    own = {id(op) for op in layer.inputs}  # the call's arguments take their place
    ops: list[Op] = []
    out: list[str] = []
    for op in layer.ops:
        if id(op) in own:
            continue
        if op.has(Sink):
            out = [inputs.get(v, values + v) for v in op.values]
            continue
        ops.append(_rename_op(op, lambda v: inputs.get(v, values + v), lambda d: decls + d, env))
    return ops, out


def _inline_call(program: Program, call: Op, stack: InstanceDecl, n: int
                 ) -> tuple[list[Decl], list[Op], list[str]]:
    layer = program.block(stack.block)
    decls: list[Decl] = []
    ops: list[Op] = []
    current = list(call.args)
    for i in range(n):
        prefix = f"{stack.name}.{i}."
        env = _layer_env(layer, i, stack.count)  # type: ignore[arg-type]
        decls += [_rename_decl(d, prefix, env) for d in layer.decls]
        layer_ops, out = _inline_layer(layer, current, prefix, prefix, env)
        ops += layer_ops
        current = out + current[len(out):]  # the state and carried streams thread; memory is shared
    return decls, ops, current[:len(out)]


# facts that permit a wiring rather than claim one: what an inlined block states of its own updates, the flat
# block states of those same updates
_PERMITS = ("residual_from_norm",)


def _permits(parent: Block, inlined: list[Block]) -> tuple[Const, ...]:
    """The permissions some inlined block states as 1 and ``parent`` does not state at all."""
    own = {c.name for c in parent.consts}
    out = []
    for name in _PERMITS:
        given = [c for b in inlined for c in b.consts
                 if c.name == name and isinstance(c.value, C.Num) and c.value.value == 1]
        if given and name not in own:
            out.append(Const(name, C.Num(1), given[0].span))
    return tuple(out)


def _splice(program: Program, parent: Block, decls: dict[str, list[Decl]],
            calls: dict[int, tuple[list[Op], list[str]]], callees: list[Block]) -> Program:
    """``parent`` with each replaced declaration's new declarations and each inlined call's ops; a permission an
    inlined block states (``residual_from_norm = 1``) is stated by ``parent`` too, unless it states its own."""
    new_decls = [x for d in parent.decls for x in (decls[d.name] if d.name in decls else [d])]
    ops: list[Op] = []
    renamed: dict[str, str] = {}
    for op in parent.ops:
        inlined = calls.get(id(op))
        op = op.reading(renamed)  # type: ignore[assignment]
        if inlined is None:
            ops.append(op)
            continue
        body, out = inlined
        ops += [o.reading(renamed) for o in body]  # type: ignore[misc]
        renamed.update(zip(op.results, out))
    block = replace(parent, decls=tuple(new_decls), ops=tuple(ops), consts=parent.consts + _permits(parent, callees))
    return replace(program, blocks=tuple(block if b.name == parent.name else b for b in program.blocks))


def inline_calls(program: Program, name: str) -> tuple[Program, bool]:
    """Inline every call of a single block instance (not a stack) in block ``name``, one level deep.

    An instance called at several sites keeps one set of declarations (it is
    one instance, whose state every call shares); each call's values get
    their own prefix (``name.`` for the first call, ``name@2.`` for the second…).
    """
    parent = program.block(name)
    instances = {d.name: d for d in parent.decls if isinstance(d, InstanceDecl) and d.count is None
                 and d.block in program.block_map}
    decls: dict[str, list[Decl]] = {}
    calls: dict[int, tuple[list[Op], list[str]]] = {}
    seen: dict[str, int] = {}
    blocks: list[Block] = []
    for op in parent.ops:
        d = instances.get(getattr(op, "decl", None) or "")
        if not op.has(Calls) or d is None:
            continue
        layer = program.block(d.block)
        blocks.append(layer)
        env = _layer_env(layer, 0, C.Num(1))
        decls.setdefault(d.name, [_rename_decl(x, f"{d.name}.", env) for x in layer.decls])
        seen[d.name] = seen.get(d.name, 0) + 1
        values = f"{d.name}." if seen[d.name] == 1 else f"{d.name}@{seen[d.name]}."
        calls[id(op)] = _inline_layer(layer, list(op.args), values, f"{d.name}.", env)
    if not calls:
        return program, False
    return _splice(program, parent, decls, calls, blocks), True


def inline_stacks(program: Program, name: str, sizes: Sizes,
                  layers: Mapping[str, int] | None = None) -> tuple[Program, bool]:
    """Inline every dropout-free stack that block ``name`` calls exactly once; depths come from ``sizes``.

    ``layers`` limits how many layers of the named stacks are written out (analyses that extrapolate
    a repeating pattern need only the first few); ``num_layers`` keeps the declared count.
    """
    layers = layers or {}
    parent = program.block(name)
    scope = sizes.for_block(parent)
    calls: dict[str, list[Op]] = {}
    for op in parent.ops:
        if op.has(Calls):
            calls.setdefault(op.decl, []).append(op)  # type: ignore[union-attr]
    decls: dict[str, list[Decl]] = {}
    inlined: dict[int, tuple[list[Op], list[str]]] = {}
    blocks: list[Block] = []
    for d in parent.decls:
        if isinstance(d, InstanceDecl) and d.count is not None and len(calls.get(d.name, ())) == 1 \
                and not _draws_dropout(program.block(d.block)):
            n = scope.count(d.count, f"the layer count of '{d.name}'", d.span)  # type: ignore[arg-type]
            call = calls[d.name][0]
            decls[d.name], ops, out = _inline_call(program, call, d, min(n, layers.get(d.name, n)))
            inlined[id(call)] = (ops, out)
            blocks.append(program.block(d.block))
    if not inlined:
        return program, False
    return _splice(program, parent, decls, inlined, blocks), True


def inline_pass(name: str, sizes: Sizes, layers: Mapping[str, int] | None = None) -> Pass[None]:
    """:func:`inline_stacks` of block ``name`` as a pass."""
    return program_pass("inline", lambda program: inline_stacks(program, name, sizes, layers))
